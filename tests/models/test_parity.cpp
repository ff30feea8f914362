// L1 parity: lmx's logits are bit-identical to mlx-lm's on CPU for the same weights.
//
// The rows (tiny random models + the mlx-lm reference run) come from scripts/gen_tiny_models.py,
// which writes $LMX_TEST_DATA/parity/index.json and one directory per row. Each row replays the
// recorded model calls of mlx-lm's generate_step (prefill chunks, the last prompt token, greedy
// decode steps) against lmx::load_model(dir, {.exact = true}) (tier L1) and requires
// max |lmx - mlx-lm| == 0 for every call.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "cache/kv_config.h"
#include "core/error.h"
#include "core/json.h"
#include "generate/generate.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "test_util.h"

namespace lmx {
namespace {

namespace fs = std::filesystem;

// A row name, or a placeholder when the index can't be read (the test then fails loudly).
constexpr const char* kNoIndex = "missing_parity_index";
std::string& index_error() {
  static std::string error;
  return error;
}

// Read while gtest registers the tests, so it can't use data_path() (that reports failures).
std::vector<std::string> parity_rows() {
  const char* env = std::getenv("LMX_TEST_DATA");
  fs::path dir = env ? fs::path(env) : fs::path(LMX_DEFAULT_TEST_DATA);
  fs::path index = dir / "parity" / "index.json";
  std::vector<std::string> rows;
  try {
    json meta = read_json_file(index);
    for (const auto& row : meta.at("rows")) {
      rows.push_back(row.at("name").get<std::string>());
    }
  } catch (const std::exception& e) {
    index_error() = e.what();
    rows.clear();
  }
  if (rows.empty()) rows.emplace_back(kNoIndex);
  return rows;
}

// One recorded model call of the reference run.
struct Call {
  std::string key;
  std::string kind;  // prefill, last_prompt, decode
  int offset = 0;
  bool eval_cache = false;
  bool tap = false;  // layer outputs and the final norm's state were recorded too
  mx::array tokens = mx::array(0);
  mx::array logits = mx::array(0);
};

struct Reference {
  std::vector<Call> calls;
  std::vector<int> generated;
  GenerateOptions kv;  // kv_bits / kv_group_size / quantized_kv_start / kv_config of the run
  Weights taps;        // call_NNN.tap.<layer> and call_NNN.tap.final
};

Reference load_reference(const fs::path& dir) {
  json meta = read_json_file(dir / "reference.json");
  Weights arrays = load_safetensors(dir / "reference.safetensors");
  Reference ref;
  for (const auto& c : meta.at("calls")) {
    Call call;
    call.key = c.at("key").get<std::string>();
    call.kind = c.at("kind").get<std::string>();
    call.offset = c.at("offset").get<int>();
    call.eval_cache = c.at("eval_cache").get<bool>();
    call.tap = c.value("tap", false);
    call.tokens = arrays.at(call.key + ".tokens");
    call.logits = arrays.at(call.key + ".logits");
    ref.calls.push_back(std::move(call));
  }
  for (const auto& [k, a] : arrays)
    if (k.find(".tap.") != std::string::npos) ref.taps.insert_or_assign(k, a);
  ref.generated = meta.at("generated").get<std::vector<int>>();
  if (meta.contains("kv_cache") && !meta.at("kv_cache").is_null()) {
    const json& kv = meta.at("kv_cache");
    ref.kv.kv_bits = kv.at("bits").get<int>();
    ref.kv.kv_group_size = kv.at("group_size").get<int>();
    ref.kv.quantized_kv_start = kv.at("start").get<int>();
  }
  return ref;
}

// generate_step's greedy sampler: argmax over the last position's log-probabilities.
int greedy_token(const mx::array& logits) {
  int len = logits.shape(1);
  int vocab = logits.shape(2);
  mx::array last = mx::reshape(mx::slice(logits, {0, len - 1, 0}, {1, len, vocab}), {1, vocab});
  mx::array logprobs = mx::subtract(last, mx::logsumexp(last, /*keepdims=*/true));
  return mx::argmax(logprobs, -1).item<int>();
}

// Describes how two logits arrays differ; empty when they are bit-identical.
std::string compare_logits(const mx::array& got, const mx::array& want) {
  std::ostringstream msg;
  if (got.shape() != want.shape()) {
    msg << "shape " << shape_str(got.shape()) << ", expected " << shape_str(want.shape());
    return msg.str();
  }
  if (got.dtype() != want.dtype()) {
    msg << "dtype " << dtype_name(got.dtype()) << ", expected " << dtype_name(want.dtype());
    return msg.str();
  }
  mx::array diff =
      mx::abs(mx::subtract(mx::astype(got, mx::float32), mx::astype(want, mx::float32)));
  mx::array max_diff = mx::max(diff);
  mx::array mismatches = mx::sum(mx::not_equal(diff, mx::array(0.0f)));
  mx::eval(max_diff, mismatches);
  float max_value = max_diff.item<float>();
  if (max_value == 0.0f) return "";  // NaN compares unequal and is reported
  int worst = mx::argmax(mx::reshape(diff, {-1})).item<int>();
  int vocab = got.shape(2);
  mx::array got_flat = mx::reshape(mx::astype(got, mx::float32), {-1});
  mx::array want_flat = mx::reshape(mx::astype(want, mx::float32), {-1});
  msg << "max |diff| " << max_value << " (" << mismatches.item<int>() << " of " << got.size()
      << " logits differ; worst at position " << worst / vocab << ", token " << worst % vocab
      << ": lmx " << mx::take(got_flat, worst).item<float>() << " vs mlx-lm "
      << mx::take(want_flat, worst).item<float>() << ")";
  return msg.str();
}

class Parity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_NE(GetParam(), kNoIndex) << "no parity rows (" << index_error()
                                    << "): run scripts/gen_tiny_models.py $LMX_TEST_DATA";
    dir_ = test::data_path("parity/" + GetParam());
    ASSERT_TRUE(fs::is_directory(dir_));
    ref_ = load_reference(dir_);
    ASSERT_FALSE(ref_.calls.empty());
    loaded_ = load_model(dir_, {.exact = true});
    ASSERT_NE(loaded_.model, nullptr);
    // Per-layer KV bits, read as LanguageModel::load reads them.
    if (fs::exists(dir_ / "kv_config.json")) {
      const int num_caches = static_cast<int>(loaded_.model->make_cache().size());
      ref_.kv.kv_config = read_kv_config(dir_ / "kv_config.json", num_caches);
      ASSERT_FALSE(ref_.kv.kv_config->empty());
    }
  }

  // Replays the reference calls in order, feeding `input(i)` to call i and handing its logits to
  // `on_logits` (after evaluating the cache state where mlx-lm's prefill does).
  void replay(const std::function<void(size_t, const mx::array&)>& on_logits,
              const std::function<mx::array(size_t)>& input) {
    Model& model = *loaded_.model;
    Cache cache = model.make_cache();
    for (size_t i = 0; i < ref_.calls.size(); ++i) {
      const Call& call = ref_.calls[i];
      ASSERT_EQ(cache.empty() ? 0 : cache[0]->offset(), call.offset)
          << GetParam() << " " << call.key << ": cache offset before the call";
      mx::array logits = model(input(i), cache);
      // generate_step quantizes the cache after every model call when kv_bits is set.
      maybe_quantize_kv_cache(cache, ref_.kv);
      if (call.eval_cache) {
        std::vector<mx::array> outputs{logits};
        for (auto& c : cache) {
          for (auto& a : c->state()) outputs.push_back(a);
        }
        mx::eval(outputs);
      } else {
        mx::eval(logits);
      }
      on_logits(i, logits);
    }
  }

  fs::path dir_;
  Reference ref_;
  LoadedWeights loaded_;
};

// Every call, fed the recorded tokens: logits identical in shape, dtype and every bit.
TEST_P(Parity, LogitsBitIdentical) {
  std::vector<std::string> failures;
  replay(
      [&](size_t i, const mx::array& logits) {
        const Call& call = ref_.calls[i];
        std::string diff = compare_logits(logits, call.logits);
        if (!diff.empty()) {
          failures.push_back(call.key + " (" + call.kind + ", offset " +
                             std::to_string(call.offset) + ", L " +
                             std::to_string(call.tokens.shape(1)) + "): " + diff);
        }
      },
      [&](size_t i) { return ref_.calls[i].tokens; });
  if (!failures.empty()) {
    std::ostringstream msg;
    msg << GetParam() << ": " << failures.size() << " of " << ref_.calls.size()
        << " calls differ from mlx-lm";
    for (const auto& f : failures) msg << "\n  " << f;
    ADD_FAILURE() << msg.str();
  }
}

// Greedy generation from lmx's own logits (its argmax fed back) gives mlx-lm's tokens.
TEST_P(Parity, GreedyTokensMatch) {
  std::vector<int> generated;
  replay(
      [&](size_t i, const mx::array& logits) {
        if (ref_.calls[i].kind != "prefill") generated.push_back(greedy_token(logits));
      },
      [&](size_t i) {
        const Call& call = ref_.calls[i];
        if (call.kind != "decode") return call.tokens;
        return mx::array({generated.back()}, {1, 1}, mx::int32);
      });
  EXPECT_EQ(generated, ref_.generated) << GetParam() << ": greedy tokens differ from mlx-lm";
}

// With a hidden-state tap on every layer and the final norm, the recorded states equal mlx-lm's
// layer outputs (at the first call and the first decode step) and the logits stay bit-identical.
TEST_P(Parity, HiddenTapMatchesLayerOutputs) {
  Model& model = *loaded_.model;
  Cache cache = model.make_cache();
  size_t last = 0;
  for (size_t i = 0; i < ref_.calls.size(); ++i)
    if (ref_.calls[i].tap) last = i;
  ASSERT_TRUE(ref_.calls[last].tap) << "no call with recorded hidden states";
  std::vector<std::string> failures;
  for (size_t i = 0; i <= last; ++i) {
    const Call& call = ref_.calls[i];
    HiddenTap tap;
    tap.final_norm = true;
    for (int l = 0; l < model.num_layers(); ++l) tap.layers.insert(l);
    if (call.tap) model.set_hidden_tap(&tap);
    mx::array logits = model(call.tokens, cache);
    model.set_hidden_tap(nullptr);
    maybe_quantize_kv_cache(cache, ref_.kv);
    std::vector<mx::array> outputs{logits};
    for (auto& c : cache)
      for (auto& a : c->state()) outputs.push_back(a);
    mx::eval(outputs);
    std::string diff = compare_logits(logits, call.logits);
    if (!diff.empty()) failures.push_back(call.key + " logits: " + diff);
    if (!call.tap) continue;
    ASSERT_EQ(static_cast<int>(tap.layer_states.size()), model.num_layers());
    ASSERT_TRUE(tap.final_state.has_value());
    for (int l = 0; l <= model.num_layers(); ++l) {
      const std::string name = l < model.num_layers() ? std::to_string(l) : "final";
      const mx::array& got = l < model.num_layers() ? tap.layer_states.at(l) : *tap.final_state;
      diff = compare_logits(got, ref_.taps.at(call.key + ".tap." + name));
      if (diff.empty()) continue;
      std::string msg = call.key;
      failures.push_back(msg.append(" layer ").append(name).append(": ").append(diff));
    }
  }
  for (const auto& f : failures) ADD_FAILURE() << GetParam() << " " << f;
}

// gpt-oss's attention sinks need mx.fast attention: once kv_bits quantizes its caches, the next
// forward is refused with a clear error (mlx-lm raises there too), not a wrong answer.
TEST(GptOss, QuantizedKVCacheWithSinksIsRefused) {
  LoadedWeights loaded = load_model(test::data_path("parity/gpt_oss_f32"), {.exact = true});
  Cache cache = loaded.model->make_cache();
  mx::eval((*loaded.model)(mx::array({1, 2, 3}, {1, 3}, mx::int32), cache));
  GenerateOptions kv;
  kv.kv_bits = 8;
  kv.kv_group_size = 32;
  kv.quantized_kv_start = 0;
  maybe_quantize_kv_cache(cache, kv);
  try {
    mx::eval((*loaded.model)(mx::array({4}, {1, 1}, mx::int32), cache));
    ADD_FAILURE() << "a forward over quantized caches with sinks succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a quantized KV cache does not support attention sinks"),
              std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, Parity, ::testing::ValuesIn(parity_rows()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace lmx
