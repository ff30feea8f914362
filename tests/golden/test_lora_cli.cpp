// `lmx generate --adapter-path` on the default SmolLM2 model with the adapter of
// scripts/gen_lora_fixtures.py --smollm2: tier L1 prints mlx_lm.generate's greedy text with the
// adapter loaded (mlx_lm.utils.load(path, adapter_path=...)); a bad path is a clear error.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace lmx {
namespace {

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct Reference {
  std::string prompt, text, base_text;
  int max_tokens = 0;
};

Reference reference() {
  std::ifstream in(test::data_path("lora/smollm2/reference.json"));
  const auto j = nlohmann::json::parse(in);
  return {j.at("prompt"), j.at("text"), j.at("base_text"), j.at("max_tokens")};
}

std::string args(const Reference& r, const std::string& extra) {
  return "generate --model " + quote(test::data_path("smollm2-135m-instruct-4bit").string()) +
         " --prompt " + quote(r.prompt) + " --max-tokens " + std::to_string(r.max_tokens) + " " +
         extra;
}

std::string adapter() { return quote(test::data_path("lora/smollm2/adapter").string()); }

TEST(LoraCli, ExactGenerateWithAdapterPrintsMlxLmText) {
  const Reference r = reference();
  ASSERT_NE(r.text, r.base_text) << "the adapter does not change mlx-lm's greedy text";
  const auto res = test::run_lmx(args(r, "--exact --adapter-path " + adapter()));
  ASSERT_EQ(res.exit_code, 0) << res.err;
  EXPECT_EQ(res.out, r.text + "\n");
}

TEST(LoraCli, DefaultTierGenerateWithAdapterRuns) {
  const Reference r = reference();
  const auto res = test::run_lmx(args(r, "--verbose --adapter-path " + adapter()));
  ASSERT_EQ(res.exit_code, 0) << res.err;
  EXPECT_NE(res.err.find("tier: L3"), std::string::npos) << res.err;
  EXPECT_NE(res.out, r.base_text + "\n") << "the default tier printed the base model's text";
}

TEST(LoraCli, MissingAdapterIsAClearError) {
  const Reference r = reference();
  const auto res = test::run_lmx(args(r, "--adapter-path /nonexistent/adapter"));
  EXPECT_EQ(res.exit_code, 1);
  EXPECT_NE(
      res.err.find("lmx: error: [/nonexistent/adapter] LoRA adapter directory does not exist"),
      std::string::npos)
      << res.err;
}

}  // namespace
}  // namespace lmx
