// The Qwen3-Next / Qwen3.5 hybrids' linear-attention state (ArraysCache) beyond the parity table:
// a prompt cache saved and loaded continues exactly as the cache in memory (and as mlx-lm), the
// state refuses trim and speculative rollback by name, prefix reuse takes only whole entries, and
// config errors name config.json and the key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <list>
#include <string>
#include <vector>

#include "cache/arrays_cache.h"
#include "cache/prompt_cache.h"
#include "cache/prompt_cache_lru.h"
#include "core/error.h"
#include "core/json.h"
#include "generate/speculative.h"
#include "io/safetensors.h"
#include "lmx/lmx.h"
#include "models/model.h"
#include "test_util.h"

namespace lmx {
namespace {

namespace fs = std::filesystem;

struct Recorded {
  std::vector<mx::array> tokens, logits;
  std::vector<std::string> kinds;
};

Recorded recorded(const fs::path& dir) {
  const json meta = read_json_file(dir / "reference.json");
  const Weights arrays = load_safetensors(dir / "reference.safetensors");
  Recorded r;
  for (const auto& c : meta.at("calls")) {
    const std::string key = c.at("key").get<std::string>();
    r.tokens.push_back(arrays.at(key + ".tokens"));
    r.logits.push_back(arrays.at(key + ".logits"));
    r.kinds.push_back(c.at("kind").get<std::string>());
  }
  return r;
}

bool identical(const mx::array& a, const mx::array& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         mx::array_equal(a, b, /*equal_nan=*/false).item<bool>();
}

void eval_cache(const Cache& cache) {
  std::vector<mx::array> s;
  for (const auto& c : cache)
    for (const auto& a : c->state()) s.push_back(a);
  mx::eval(s);
}

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() / ("lmx_hybrid_" + std::to_string(::getpid()) + "_" + name);
}

class Hybrid : public ::testing::TestWithParam<std::string> {};

// After the prefill chunks the cache is saved and loaded; the rest of mlx-lm's run (the last
// prompt token and the decode steps) on the loaded cache and on the one in memory both give
// mlx-lm's logits, every bit.
TEST_P(Hybrid, PromptCacheRoundTripContinuesAsInMemory) {
  const fs::path dir = test::data_path("parity/" + GetParam());
  const Recorded ref = recorded(dir);
  LoadedWeights loaded = load_model(dir, {.exact = true});
  Model& model = *loaded.model;
  Cache cache = model.make_cache();
  size_t i = 0;
  for (; ref.kinds[i] == "prefill"; ++i) {
    mx::eval(model(ref.tokens[i], cache));
    eval_cache(cache);
  }
  ASSERT_GT(i, 0u);
  const fs::path file = temp_file(GetParam() + ".safetensors");
  save_prompt_cache(file, cache, {{"row", GetParam()}});
  PromptCache back = load_prompt_cache(file);
  fs::remove(file);
  EXPECT_EQ(back.metadata.at("row"), GetParam());
  ASSERT_EQ(back.cache.size(), cache.size());
  int linear = 0;
  for (size_t l = 0; l < cache.size(); ++l) {
    EXPECT_EQ(back.cache[l]->offset(), cache[l]->offset()) << "layer " << l;
    if (dynamic_cast<ArraysCache*>(back.cache[l].get())) ++linear;
  }
  EXPECT_GT(linear, 0);
  for (; i < ref.tokens.size(); ++i) {
    mx::array mem = model(ref.tokens[i], cache);
    mx::array disk = model(ref.tokens[i], back.cache);
    mx::eval(mem, disk);
    EXPECT_TRUE(identical(mem, ref.logits[i])) << "call " << i << " in memory";
    EXPECT_TRUE(identical(disk, ref.logits[i])) << "call " << i << " after save/load";
  }
}

// trim refuses by name, speculative decoding refuses the model before it runs, and a hybrid
// prompt-cache entry is reused only when all its tokens are a prefix of the new prompt.
TEST_P(Hybrid, StateRefusesRollbackAndPartialReuse) {
  const fs::path dir = test::data_path("parity/" + GetParam());
  LoadedWeights loaded = load_model(dir, {.exact = true});
  Model& model = *loaded.model;
  const std::vector<int> tokens = {5, 9, 2, 7, 11, 3, 8, 1, 4, 6};
  auto prefilled = [&] {
    Cache c = model.make_cache();
    mx::eval(model(mx::array(tokens.data(), {1, static_cast<int>(tokens.size())}, mx::int32), c));
    eval_cache(c);
    return c;
  };
  Cache cache = prefilled();
  ArraysCache* state = dynamic_cast<ArraysCache*>(cache[0].get());
  ASSERT_NE(state, nullptr);
  EXPECT_FALSE(state->is_trimmable());
  EXPECT_EQ(state->offset(), static_cast<int>(tokens.size()));
  EXPECT_EQ(state->trim(0), 0);
  try {
    state->trim(2);
    ADD_FAILURE() << "trim(2) on an ArraysCache did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[ArraysCache] cannot trim 2 tokens"), std::string::npos)
        << e.what();
  }

  GenerateOptions opt;
  opt.max_tokens = 4;
  opt.prompt_lookup = 2;
  Cache fresh = model.make_cache();
  Drafter drafter;
  drafter.prompt_lookup = 2;
  try {
    SpeculativeGenerator gen(model, fresh, {}, tokens, opt, drafter);
    ADD_FAILURE() << "speculative decoding accepted a model with a linear-attention state";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cache layer 0 cannot be rolled back"), std::string::npos)
        << e.what();
  }

  PromptCacheLRU lru(4, std::nullopt);
  lru.put("m", tokens, prefilled());
  // Shares only 5 tokens: reusing them would need the state of 5 tokens, which is gone.
  std::vector<int> other(tokens.begin(), tokens.begin() + 5);
  other.insert(other.end(), {99, 98, 97});
  EXPECT_FALSE(lru.take("m", other).has_value());
  EXPECT_EQ(lru.entries(), 1u);
  // The conversation continued: all 10 cached tokens are reused, untrimmed.
  std::vector<int> longer = tokens;
  longer.insert(longer.end(), {12, 13});
  auto hit = lru.take("m", longer);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->reused, tokens.size());
  EXPECT_EQ(hit->cache[0]->offset(), static_cast<int>(tokens.size()));
  // And it continues exactly as the cache that never left memory.
  mx::array next(longer.data() + tokens.size(), {1, 2}, mx::int32);
  mx::array a = model(next, hit->cache), b = model(next, cache);
  mx::eval(a, b);
  EXPECT_TRUE(identical(a, b));
}

// In the scheduler a speculative request on a hybrid ends with that error while a plain request
// beside it runs to its length, and a follow-up prompt continuing the first reuses its cache.
TEST_P(Hybrid, SchedulerRefusesSpeculativeRowsAndReusesWholeEntries) {
  const fs::path src = fs::absolute(test::data_path("parity/" + GetParam()));
  const fs::path tok = fs::absolute(test::data_path("smollm2-135m-instruct-4bit"));
  const fs::path dir = temp_file(GetParam() + "_model");
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(src))
    if (!e.path().filename().string().starts_with("reference"))
      fs::create_symlink(e.path(), dir / e.path().filename());
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"})
    fs::create_symlink(tok / name, dir / name);
  LanguageModel model = LanguageModel::load(dir, {.exact = true});
  Scheduler s(model, {.max_batch = 2, .prefill_step_size = 8});
  std::list<std::promise<StreamResult>> promises;  // outlive the requests
  std::vector<int> generated;                      // the plain request's tokens
  auto run = [&](std::vector<int> prompt, int prompt_lookup) {
    std::promise<StreamResult>& done = promises.emplace_back();
    StreamRequest r;
    r.prompt = std::move(prompt);
    r.options.max_tokens = 5;
    r.options.ignore_eos = true;
    r.options.prompt_lookup = prompt_lookup;
    r.on_token = [&generated, plain = prompt_lookup == 0](const StreamToken& t) {
      if (t.token >= 0 && plain) generated.push_back(t.token);
      return true;
    };
    r.on_done = [&done](const StreamResult& res) { done.set_value(res); };
    auto f = done.get_future();
    s.submit(std::move(r));
    return f;
  };
  const std::vector<int> prompt = {5, 9, 2, 7, 11, 3, 8, 1, 4, 6, 5, 9};
  auto spec = run(prompt, 2);
  auto plain = run(prompt, 0);
  const StreamResult a = spec.get(), b = plain.get();
  EXPECT_EQ(a.finish_reason, "error");
  EXPECT_NE(a.error.find("cannot be rolled back"), std::string::npos) << a.error;
  EXPECT_EQ(b.finish_reason, "length") << b.error;
  ASSERT_EQ(generated.size(), 5u);
  // The conversation continued (prompt, answer, a new turn): the state of prompt + the 4 answer
  // tokens fed is reused whole.
  std::vector<int> longer = prompt;
  longer.insert(longer.end(), generated.begin(), generated.end());
  longer.insert(longer.end(), {12, 13});
  generated.clear();
  const StreamResult c = run(longer, 0).get();
  EXPECT_EQ(c.finish_reason, "length") << c.error;
  EXPECT_EQ(c.cached_tokens, prompt.size() + 4);
  // A prompt sharing only part of it reuses nothing.
  std::vector<int> diverged(prompt.begin(), prompt.begin() + 6);
  diverged.insert(diverged.end(), {99, 98, 97});
  const StreamResult d = run(diverged, 0).get();
  EXPECT_EQ(d.finish_reason, "length") << d.error;
  EXPECT_EQ(d.cached_tokens, 0u);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Rows, Hybrid,
                         ::testing::Values("qwen3_next_f32", "qwen3_next_q4_g64", "qwen3_5",
                                           "qwen3_5_moe_f32"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// A config missing a key the family needs, or with an unknown or inconsistent layer_types entry:
// the error names config.json and the key.
class HybridConfig : public ::testing::Test {
 protected:
  void SetUp() override { use("qwen3_next_dense"); }
  void TearDown() override { fs::remove_all(dir_); }

  // A directory of links to the row's files beside an editable config_.
  void use(const std::string& row) {
    const fs::path src = fs::absolute(test::data_path("parity/" + row));
    dir_ = fs::temp_directory_path() / ("lmx_hybrid_cfg_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const auto& e : fs::directory_iterator(src))
      if (e.path().filename() != "config.json")
        fs::create_symlink(e.path(), dir_ / e.path().filename());
    config_ = read_json_file(src / "config.json");
  }

  std::string load_error() {
    std::ofstream(dir_ / "config.json") << config_.dump();
    try {
      load_model(dir_, {.exact = true});
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  }

  fs::path dir_;
  json config_;
};

TEST_F(HybridConfig, MissingKeysAreNamed) {
  for (const char* key : {"linear_conv_kernel_dim", "linear_num_value_heads",
                          "partial_rotary_factor", "mlp_only_layers", "head_dim"}) {
    json saved = config_;
    config_.erase(key);
    EXPECT_EQ(load_error(), std::string("[config.json] missing required key '") + key + "'");
    config_ = saved;
  }
}

TEST_F(HybridConfig, LayerTypesMustBeKnownAndAgreeWithTheInterval) {
  config_["layer_types"] = {"linear_attention", "linear_attention", "sliding_attention",
                            "full_attention"};
  EXPECT_EQ(load_error(),
            "[config.json] layer_types entry 2 \"sliding_attention\" is not supported, expected "
            "\"linear_attention\" or \"full_attention\"");
  config_["layer_types"] = {"linear_attention", "full_attention", "linear_attention",
                            "full_attention"};
  EXPECT_EQ(load_error(),
            "[config.json] layer_types entry 1 is \"full_attention\", expected "
            "\"linear_attention\" (full_attention_interval 4)");
  config_["layer_types"] = {"linear_attention", "linear_attention", "linear_attention",
                            "full_attention"};
  EXPECT_EQ(load_error(), "(no error)");
}

// A config whose sizes the tensors do not have: the first tensor that differs, with both shapes.
TEST_F(HybridConfig, TensorsNotMatchingTheConfigAreNamed) {
  config_["linear_conv_kernel_dim"] = 3;
  const std::string e = load_error();
  EXPECT_NE(e.find("tensor 'model.layers.0.linear_attn.conv1d.weight' has shape [192, 4, 1], "
                   "expected [192, 3, 1]"),
            std::string::npos)
      << e;
}

// qwen3_5 reads its keys from text_config: the error names it.
TEST_F(HybridConfig, Qwen3_5NamesTextConfigKeys) {
  use("qwen3_5");
  const json saved = config_;
  EXPECT_EQ(load_error(), "(no error)");
  config_["text_config"].erase("linear_key_head_dim");
  EXPECT_EQ(load_error(), "[config.json text_config] missing required key 'linear_key_head_dim'");
  config_ = saved;
  config_["text_config"]["layer_types"] = {"linear_attention", "full_attention", "full_attention",
                                           "full_attention"};
  EXPECT_EQ(load_error(),
            "[config.json text_config] layer_types entry 2 is \"full_attention\", expected "
            "\"linear_attention\" (full_attention_interval 2)");
}

}  // namespace
}  // namespace lmx
