// Real checkpoint: the converted SmolLM2-135M-Instruct must reproduce mlx-lm's prompt ids,
// first-step log-probabilities (bit-identical) and greedy tokens (scripts/gen_golden.py).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "generate/generate.h"
#include "io/safetensors.h"
#include "lmx/lmx.h"
#include "models/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lmx {
namespace {

nlohmann::json read_golden() {
  std::ifstream in(test::data_path("golden/golden.json"));
  return nlohmann::json::parse(in);
}

std::filesystem::path model_dir() { return test::data_path("smollm2-135m-instruct-4bit"); }

TEST(GoldenSmolLM2, PromptIdsMatchMlxLmTokenizer) {
  const auto golden = read_golden();
  Tokenizer tok = Tokenizer::from_dir(model_dir());
  for (const auto& c : golden["cases"]) {
    EXPECT_EQ(tok.encode(c["prompt"].get<std::string>()), c["prompt_ids"].get<std::vector<int>>())
        << c["prompt"];
  }
}

TEST(GoldenSmolLM2, LogprobsAndGreedyTokensIdentical) {
  const auto golden = read_golden();
  Weights ref = load_safetensors(test::data_path("golden/logprobs.safetensors"));
  LoadedWeights lw = load_model(model_dir(), {.exact = true});
  int case_idx = 0;
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE("case " + std::to_string(case_idx));
    GenerateOptions opt;
    opt.max_tokens = golden["max_tokens"].get<int>();
    Cache cache = lw.model->make_cache();
    TokenGenerator gen(*lw.model, cache, c["prompt_ids"].get<std::vector<int>>(), opt);
    const auto expect = c["tokens"].get<std::vector<int>>();
    const auto eos = golden["eos_token_ids"].get<std::vector<int>>();
    std::vector<int> got;
    int n = 0;
    while (auto s = gen.next()) {
      if (n < c["logprob_steps"].get<int>()) {
        const std::string key =
            "case_" + std::to_string(case_idx) + ".logprobs_" + std::to_string(n);
        ASSERT_TRUE(ref.count(key)) << key;
        const mx::array& r = ref.at(key);
        ASSERT_EQ(s->logprobs.shape(), r.shape()) << key;
        ASSERT_EQ(s->logprobs.dtype(), r.dtype()) << key;
        float diff = mx::max(mx::abs(mx::subtract(mx::astype(s->logprobs, mx::float32),
                                                  mx::astype(r, mx::float32))))
                         .item<float>();
        EXPECT_EQ(diff, 0.0f) << key;
      }
      ++n;
      if (std::find(eos.begin(), eos.end(), s->token) != eos.end()) break;
      got.push_back(s->token);
    }
    EXPECT_EQ(got, expect);
    ++case_idx;
  }
}

TEST(GoldenSmolLM2, PublicApiStreamsTheSameText) {
  const auto golden = read_golden();
  const auto& c = golden["cases"][0];
  LanguageModel m = LanguageModel::load(model_dir(), {.exact = true});
  GenerateOptions opt;
  opt.max_tokens = golden["max_tokens"].get<int>();
  std::string text;
  std::vector<int> tokens;
  m.generate(m.encode(c["prompt"].get<std::string>()), opt, [&](const TokenOutput& t) {
    if (t.token >= 0) tokens.push_back(t.token);
    text += t.text;
    return true;
  });
  EXPECT_EQ(tokens, c["tokens"].get<std::vector<int>>());
  EXPECT_EQ(text, c["text"].get<std::string>());
}

TEST(GoldenSmolLM2, PromptLongerThanContextIsAnError) {
  const auto dir = model_dir();
  std::string prompt;
  for (int i = 0; i < 9000; ++i) prompt += "hello ";
  LanguageModel m = LanguageModel::load(dir);
  const auto ids = m.encode(prompt);
  ASSERT_GT(ids.size(), static_cast<size_t>(*m.context_length()));
  try {
    m.generate(ids, GenerateOptions{}, [](const TokenOutput&) { return true; });
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("longer than the model's context of 8192"),
              std::string::npos)
        << e.what();
  }
  const auto file = std::filesystem::temp_directory_path() / "lmx_long_prompt.txt";
  std::ofstream(file) << prompt;
  auto r = test::run_lmx("generate --model " + dir.string() + " --prompt \"$(cat " + file.string() +
                         ")\"");
  std::filesystem::remove(file);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("longer than the model's context"), std::string::npos) << r.err;
}

TEST(GoldenSmolLM2, InvalidUtf8PromptIsAnError) {
  auto r = test::run_lmx("generate --model " + model_dir().string() +
                         " --prompt \"$(printf 'abc\\377def')\"");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("invalid UTF-8"), std::string::npos) << r.err;
}

TEST(GoldenSmolLM2, CliGeneratesTheGoldenText) {
  const auto golden = read_golden();
  const auto& c = golden["cases"][0];
  const auto file = std::filesystem::temp_directory_path() / "lmx_golden_prompt.txt";
  std::ofstream(file) << c["prompt"].get<std::string>();
  auto r = test::run_lmx("generate --exact --model " + model_dir().string() + " --max-tokens " +
                         std::to_string(golden["max_tokens"].get<int>()) + " --prompt - < " +
                         file.string());
  std::filesystem::remove(file);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, c["text"].get<std::string>() + "\n");
}

}  // namespace
}  // namespace lmx
