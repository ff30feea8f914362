// Real checkpoint: Gemma 3 270M (the Q4_K_M GGUF converted by lmx convert) must reproduce
// mlx-lm's 128 greedy tokens and bit-identical first-step log-probabilities for the same prompt
// ids, including a prompt longer than the 512-token sliding window, once more with 8-bit KV caches
// (quantized rings on the sliding layers; scripts/gen_golden_gemma3.py).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "generate/generate.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lmx {
namespace {

nlohmann::json read_golden() {
  std::ifstream in(test::data_path("golden-gemma3/golden.json"));
  return nlohmann::json::parse(in);
}

std::filesystem::path model_dir() { return test::data_path("gemma3-270m"); }

TEST(GoldenGemma3, GreedyTokensAndLogprobsIdentical) {
  const auto golden = read_golden();
  Weights ref = load_safetensors(test::data_path("golden-gemma3/logprobs.safetensors"));
  LoadedWeights lw = load_model(model_dir(), {.exact = true});
  int case_idx = 0;
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE("case " + std::to_string(case_idx));
    GenerateOptions opt;
    opt.max_tokens = c["max_tokens"].get<int>();
    if (!c["kv"].is_null()) {
      opt.kv_bits = c["kv"]["kv_bits"].get<int>();
      opt.kv_group_size = c["kv"]["kv_group_size"].get<int>();
      opt.quantized_kv_start = c["kv"]["quantized_kv_start"].get<int>();
    }
    Cache cache = lw.model->make_cache();
    TokenGenerator gen(*lw.model, cache, c["prompt_ids"].get<std::vector<int>>(), opt);
    std::vector<int> got;
    while (auto s = gen.next()) {
      const int n = static_cast<int>(got.size());
      if (n < golden["logprob_steps"].get<int>()) {
        const std::string key =
            "case_" + std::to_string(case_idx) + ".logprobs_" + std::to_string(n);
        ASSERT_TRUE(ref.count(key)) << key;
        const mx::array& r = ref.at(key);
        ASSERT_EQ(s->logprobs.shape(), r.shape()) << key;
        ASSERT_EQ(s->logprobs.dtype(), r.dtype()) << key;
        EXPECT_TRUE(mx::array_equal(s->logprobs, r).item<bool>()) << key;
      }
      got.push_back(s->token);
    }
    EXPECT_EQ(got, c["tokens"].get<std::vector<int>>());
    ++case_idx;
  }
  EXPECT_EQ(case_idx, 3);
}

// lmx's tokenizer on the converted tokenizer.json gives mlx-lm's prompt ids and text.
TEST(GoldenGemma3, TokenizerMatchesMlxLm) {
  const auto golden = read_golden();
  Tokenizer tok = Tokenizer::from_dir(model_dir());
  for (const auto& c : golden["cases"]) {
    EXPECT_EQ(tok.encode(c["prompt"].get<std::string>()), c["prompt_ids"].get<std::vector<int>>());
    EXPECT_EQ(tok.decode(c["tokens"].get<std::vector<int>>()), c["text"].get<std::string>());
  }
}

}  // namespace
}  // namespace lmx
