// `lmx generate --adapter-path` on the default SmolLM2 model with the adapter of
// scripts/gen_lora_fixtures.py --smollm2: tier L1 prints mlx_lm.generate's greedy text with the
// adapter loaded (mlx_lm.utils.load(path, adapter_path=...)); a bad path is a clear error; tier
// L3 with the adapter passes the teacher-forced gates against L1 with it.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "models/model.h"
#include "test_util.h"
#include "tier_gate.h"
#include "tokenizer/tokenizer.h"

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

// docs/cpu.md's teacher-forced gates on 128 tokens of real text (L1 prefill on this CPU is ~10
// tokens/s), both tiers with the adapter; a dropped adapter would fail them.
TEST(LoraTiersSmolLM2, TeacherForcedAgreesWithL1) {
  const auto model = test::data_path("smollm2-135m-instruct-4bit");
  const auto dir = test::data_path("lora/smollm2/adapter");
  LoadedWeights exact = load_model(model, {.exact = true, .adapter_path = dir});
  LoadedWeights fast = load_model(model, {.adapter_path = dir});
  ASSERT_TRUE(fast.cpu_kernels);
  std::ifstream in(test::source_dir() / "docs" / "lora.md");
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int> ids = Tokenizer::from_dir(model).encode(text.str());
  ASSERT_GE(ids.size(), 128u);
  ids.resize(128);
  const auto r = test::compare_teacher_forced(*exact.model, *fast.model, ids);
  EXPECT_GT(r.max_abs_diff, 0) << "L3 ran exactly L1's ops";
  EXPECT_LE(r.mean_kl, 1e-3);
  EXPECT_GE(r.top1_agree, 0.98);
  RecordProperty("mean_kl", std::to_string(r.mean_kl));
  LoadedWeights base = load_model(model);
  EXPECT_GT(test::compare_teacher_forced(*exact.model, *base.model, ids).mean_kl, 1e-2);
}

}  // namespace
}  // namespace lmx
