// The DFlash block drafter (src/generate/dflash.h) on scripts/gen_dflash.py's tiny Qwen3 target
// and drafters in the z-lab layout: the drafter's logits equal scripts/dflash_reference.py's
// (MLX, written from the paper), greedy DFlash decoding gives the reference's tokens and
// accepted counts and the plain tokens (plain and quantized KV caches), seeded sampling is
// reproducible, and bad checkpoints or options give named errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json.h"
#include "generate/dflash.h"
#include "generate/speculative.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "test_util.h"

namespace lmx {
namespace {

namespace fs = std::filesystem;

fs::path df_dir(const std::string& rel) { return test::data_path("dflash/" + rel); }

float max_abs_diff(const mx::array& a, const mx::array& b) {
  mx::array d = mx::max(mx::abs(mx::subtract(mx::astype(a, mx::float32), b)));
  mx::eval(d);
  return d.item<float>();
}

std::vector<int> plain_tokens(Model& m, const std::vector<int>& prompt, GenerateOptions o) {
  std::vector<int> out;
  generate(m, prompt, o, {}, [&](const Step& s) {
    out.push_back(s.token);
    return true;
  });
  return out;
}

std::vector<int> dflash_tokens(Model& m, const DFlashDrafter& d, const std::vector<int>& prompt,
                               const GenerateOptions& o, GenerationStats* stats = nullptr,
                               bool backoff = true) {
  Cache cache = m.make_cache();
  std::vector<int> out;
  Drafter drafter;
  drafter.dflash = &d;
  drafter.backoff = backoff;
  GenerationStats st =
      speculative_generate(m, cache, {}, prompt, o, drafter, {}, [&](const Step& s) {
        out.push_back(s.token);
        return true;
      });
  if (stats) *stats = st;
  return out;
}

// The target's tapped states match mlx-lm's forward, and two chained drafter calls (the second
// on the first's cache) give the reference logits.
TEST(DFlash, ForwardMatchesReference) {
  LoadedWeights target = load_model(df_dir("target"), {.exact = true});
  auto drafter = DFlashDrafter::load(df_dir("random"));
  const DFlashConfig& c = drafter->config();
  EXPECT_EQ(c.block_size, 8);
  EXPECT_EQ(c.target_layer_ids, (std::vector<int>{1, 3}));
  Weights g = load_safetensors(df_dir("golden.safetensors"));
  json golden = read_json_file(df_dir("golden.json"));
  const std::vector<int> prompt = golden.at("forward_prompt");
  const int P = static_cast<int>(prompt.size());

  HiddenTap tap;
  tap.layers = {1, 3};
  target.model->set_hidden_tap(&tap);
  Cache tc = target.model->make_cache();
  (*target.model)(mx::array(prompt.data(), {1, P}, mx::int32), tc);
  target.model->set_hidden_tap(nullptr);
  mx::array states = mx::concatenate({tap.layer_states.at(1), tap.layer_states.at(3)}, -1);
  EXPECT_LT(max_abs_diff(states, g.at("states")), 1e-4f);

  // Tolerance: float32 throughout; the drafter's own graph agrees with MLX's to rounding.
  const int mask = c.mask_token_id;
  std::vector<int> b1(8, mask), b2(8, mask);
  b1[0] = prompt[5];
  b2[0] = prompt[11];
  const mx::array& ref_states = g.at("states");
  const int F = ref_states.shape(2);
  Cache dc = drafter->make_cache();
  mx::array l1 = (*drafter)(*target.model, mx::array(b1.data(), {1, 8}, mx::int32),
                            mx::slice(ref_states, {0, 0, 0}, {1, 5, F}), dc);
  mx::array l2 = (*drafter)(*target.model, mx::array(b2.data(), {1, 8}, mx::int32),
                            mx::slice(ref_states, {0, 5, 0}, {1, 11, F}), dc);
  ASSERT_EQ(l1.shape(), g.at("logits1").shape());
  EXPECT_LT(max_abs_diff(l1, g.at("logits1")), 1e-4f);
  EXPECT_LT(max_abs_diff(l2, g.at("logits2")), 1e-4f);
  EXPECT_EQ(dc[0]->offset(), 11);
  // A wrong context (shifted states) changes the logits: the comparison can fail.
  Cache dc2 = drafter->make_cache();
  mx::array l1b = (*drafter)(*target.model, mx::array(b1.data(), {1, 8}, mx::int32),
                             mx::slice(ref_states, {0, 1, 0}, {1, 6, F}), dc2);
  EXPECT_GT(max_abs_diff(l1b, g.at("logits1")), 1e-2f);
}

// Greedy rows of scripts/gen_dflash.py: the reference's tokens and accepted counts, which are
// also the plain tokens.
TEST(DFlash, GreedyMatchesReferenceAndPlainDecoding) {
  LoadedWeights target = load_model(df_dir("target"), {.exact = true});
  json golden = read_json_file(df_dir("golden.json"));
  ASSERT_GE(golden.at("rows").size(), 4u);
  int accepted_total = 0;
  for (const auto& row : golden.at("rows")) {
    auto drafter = DFlashDrafter::load(df_dir(row.at("drafter").get<std::string>()));
    GenerateOptions o;
    o.max_tokens = row.at("max_tokens");
    o.num_draft_tokens = row.at("num_draft_tokens");
    o.prefill_step_size = 5;  // the drafter's context arrives in several prefill chunks
    const std::vector<int> prompt = row.at("prompt");
    const std::vector<int> accepted = row.at("accepted");
    const std::string where =
        row.at("drafter").get<std::string>() + " K=" + std::to_string(o.num_draft_tokens);
    // The reference drafts every round: round by round comparable without the back-off.
    GenerationStats st;
    const std::vector<int> got =
        dflash_tokens(*target.model, *drafter, prompt, o, &st, /*backoff=*/false);
    EXPECT_EQ(got, row.at("tokens").get<std::vector<int>>()) << where;
    EXPECT_EQ(got, plain_tokens(*target.model, prompt, o)) << where;
    // With it, plain rounds leave the drafter's context pending for the next drafting round.
    GenerationStats backed;
    EXPECT_EQ(dflash_tokens(*target.model, *drafter, prompt, o, &backed), got) << where;
    int sum = 0;
    for (int a : accepted) sum += a;
    EXPECT_EQ(st.speculative.accepted, sum) << where;
    EXPECT_EQ(st.speculative.rounds, static_cast<int>(accepted.size())) << where;
    accepted_total += sum;
  }
  EXPECT_GT(accepted_total, 0) << "no row accepted a proposal: the accepted path is untested";
}

// Quantized KV caches (trimmed with bypass after each verification): still the plain tokens.
TEST(DFlash, GreedyEqualsPlainWithQuantizedCaches) {
  LoadedWeights target = load_model(df_dir("target"), {.exact = true});
  auto drafter = DFlashDrafter::load(df_dir("trained"));
  std::mt19937 rng(5);
  for (int bits : {8, 4}) {
    for (int k : {3, 7}) {
      std::vector<int> prompt(10 + k);
      for (int& t : prompt) t = static_cast<int>(rng() % 383);
      GenerateOptions o;
      o.max_tokens = 40;
      o.num_draft_tokens = k;
      o.kv_bits = bits;
      o.kv_group_size = 32;
      o.quantized_kv_start = 0;
      GenerationStats st;
      EXPECT_EQ(dflash_tokens(*target.model, *drafter, prompt, o, &st),
                plain_tokens(*target.model, prompt, o))
          << bits << " bits K=" << k;
      EXPECT_EQ(st.generation_tokens, 40);
      EXPECT_LE(st.speculative.accepted, st.speculative.drafted);
    }
  }
}

// Temperature > 0: rejection sampling against the drafter's own distribution; a seed makes the
// run reproducible, and a 1-token prompt starts with an empty context.
TEST(DFlash, SeededSampling) {
  LoadedWeights target = load_model(df_dir("target"), {.exact = true});
  auto drafter = DFlashDrafter::load(df_dir("trained"));
  GenerateOptions o;
  o.max_tokens = 30;
  o.num_draft_tokens = 7;
  o.sampler.temp = 0.8f;
  o.sampler.top_p = 0.95f;
  o.seed = 1234;
  for (const std::vector<int>& prompt :
       {std::vector<int>{5, 17, 200, 9, 31}, std::vector<int>{42}}) {
    GenerationStats a, b;
    const std::vector<int> x = dflash_tokens(*target.model, *drafter, prompt, o, &a);
    const std::vector<int> y = dflash_tokens(*target.model, *drafter, prompt, o, &b);
    EXPECT_EQ(x, y);
    EXPECT_EQ(x.size(), 30u);
    for (int t : x) EXPECT_TRUE(t >= 0 && t < 384) << t;
    EXPECT_EQ(a.speculative.drafted, b.speculative.drafted);
    EXPECT_GT(a.speculative.rounds, 0);
  }
}

// A copy of the random drafter with its config or one tensor changed.
fs::path broken_copy(const std::string& name, const std::function<void(json&)>& edit_config,
                     const std::function<void(Weights&)>& edit_weights) {
  fs::path dir =
      fs::temp_directory_path() / ("lmx_dflash_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  json c = read_json_file(df_dir("random/config.json"));
  edit_config(c);
  std::ofstream(dir / "config.json") << c.dump(1);
  Weights w = load_safetensors(df_dir("random/model.safetensors"));
  edit_weights(w);
  save_safetensors(dir / "model.safetensors", w, {{"format", "mlx"}});
  return dir;
}

void expect_error(const fs::path& dir, const std::string& needle) {
  try {
    DFlashDrafter::load(dir);
    ADD_FAILURE() << "no error, expected one naming: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(DFlash, BadCheckpointsGiveNamedErrors) {
  auto keep_c = [](json&) {};
  auto keep_w = [](Weights&) {};
  expect_error(broken_copy("fc", keep_c,
                           [](Weights& w) {
                             w.insert_or_assign("fc.weight", mx::zeros({64, 96}));
                           }),
               "tensor 'fc.weight' has shape [64, 96], expected [64, 128]");
  expect_error(
      broken_copy("missing", keep_c, [](Weights& w) { w.erase("layers.1.mlp.down_proj.weight"); }),
      "missing tensor 'layers.1.mlp.down_proj.weight', expected shape [64, 128]");
  expect_error(broken_copy("extra", keep_c,
                           [](Weights& w) {
                             w.insert_or_assign("embed_tokens.weight", mx::zeros({384, 64}));
                           }),
               "embed_tokens.weight");
  expect_error(broken_copy(
                   "ids", [](json& c) { c["dflash_config"].erase("target_layer_ids"); }, keep_w),
               "missing required key 'target_layer_ids'");
  expect_error(broken_copy(
                   "range",
                   [](json& c) {
                     c["dflash_config"]["target_layer_ids"] = {1, 6};
                   },
                   keep_w),
               "target_layer_ids has 6, expected a layer in [0, num_target_layers = 6)");
  expect_error(broken_copy(
                   "block", [](json& c) { c["block_size"] = 1; }, keep_w),
               "block_size must be >= 2");
  // Keys the published code applies and lmx does not: refused unless at their defaults.
  expect_error(broken_copy(
                   "scale", [](json& c) { c["input_embedding_scale"] = 2.0; }, keep_w),
               "input_embedding_scale is 2.0, expected 1 or absent");
  expect_error(broken_copy(
                   "mult", [](json& c) { c["output_multiplier"] = 0.5; }, keep_w),
               "output_multiplier is 0.5, expected 1 or absent");
  expect_error(broken_copy(
                   "cap", [](json& c) { c["final_logit_softcapping"] = 30.0; }, keep_w),
               "final_logit_softcapping is 30.0");
  expect_error(broken_copy(
                   "causal", [](json& c) { c["is_causal"] = true; }, keep_w),
               "is_causal is true");
  expect_error(broken_copy(
                   "sliding",
                   [](json& c) {
                     c["layer_types"] = {"full_attention", "sliding_attention"};
                   },
                   keep_w),
               "expected only \"full_attention\"");
}

// block_size where the published code looks for it: dflash_config's, else the top level's, else
// 16; default values of the keys lmx refuses load.
TEST(DFlash, BlockSizeFromDflashConfigOrTopLevelOrSixteen) {
  auto keep_w = [](Weights&) {};
  fs::path inner = broken_copy(
      "inner",
      [](json& c) {
        c["dflash_config"]["block_size"] = 5;
        c["input_embedding_scale"] = 1.0;
        c["is_causal"] = false;
        c["final_logit_softcapping"] = nullptr;
      },
      keep_w);
  EXPECT_EQ(DFlashDrafter::load(inner)->config().block_size, 5);
  EXPECT_EQ(dflash_block_size(inner), 5);
  fs::path none = broken_copy("none", [](json& c) { c.erase("block_size"); }, keep_w);
  EXPECT_EQ(DFlashDrafter::load(none)->config().block_size, 16);
  EXPECT_EQ(dflash_block_size(none), 16);
  EXPECT_EQ(dflash_block_size(df_dir("random")), 8);
  fs::remove_all(inner);
  fs::remove_all(none);
}

TEST(DFlash, MismatchedTargetAndOptionsAreRefused) {
  LoadedWeights target = load_model(df_dir("target"), {.exact = true});
  const std::vector<int> prompt = {1, 2, 3, 4};
  GenerateOptions o;
  o.max_tokens = 4;
  auto run = [&](const DFlashDrafter& d, const GenerateOptions& opt, const std::string& needle) {
    try {
      dflash_tokens(*target.model, d, prompt, opt);
      ADD_FAILURE() << "no error, expected one naming: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto good = DFlashDrafter::load(df_dir("random"));
  GenerateOptions big = o;
  big.num_draft_tokens = 8;
  run(*good, big, "num_draft_tokens is 8, the DFlash drafter's block of 8 proposes at most 7");
  fs::path dir = broken_copy(
      "layers", [](json& c) { c["num_target_layers"] = 8; }, [](Weights&) {});
  auto other = DFlashDrafter::load(dir);
  fs::remove_all(dir);
  run(*other, o, "made for a target of num_target_layers = 8 layers, the model has 6");
}

}  // namespace
}  // namespace lmx
