// Tier L3 (lmx's CPU kernels) against tier L1 on the real SmolLM2-135M-Instruct 4-bit (float32
// activations and scales): mean KL <= 1e-3 over a 512-token teacher-forced text, top-1
// agreement >= 98% (over one forward, on the packed int8 path where the CPU has it and on the
// float32 kernel, and in decode-sized steps over its first 256 tokens, 512 with LMX_HEAVY=1),
// greedy output identical on >= 3 of 4 prompts for 64 tokens; and the same tokens for any thread
// count, with the AVX2 kernel and with LMX_CPU_INT8=0.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/qmm.h"
#include "models/model.h"
#include "test_util.h"
#include "tier_gate.h"
#include "tokenizer/tokenizer.h"

namespace lmx {
namespace {

std::filesystem::path model_dir() { return test::data_path("smollm2-135m-instruct-4bit"); }

std::string chat(const std::string& user) {
  return "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
}

TEST(TiersSmolLM2, TeacherForcedAndGreedyAgreeWithL1) {
  LoadedWeights exact = load_model(model_dir(), {.exact = true});
  LoadedWeights fast = load_model(model_dir());
  ASSERT_TRUE(fast.cpu_kernels);
  Tokenizer tok = Tokenizer::from_dir(model_dir());

  // A real English text: this project's testing guide, its first 512 tokens.
  std::ifstream in(test::source_dir() / "docs" / "testing.md");
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int> ids = tok.encode(text.str());
  ASSERT_GE(ids.size(), 512u);
  ids.resize(512);
  const auto r = test::compare_teacher_forced(*exact.model, *fast.model, ids);
  EXPECT_GT(r.max_abs_diff, 0) << "L3 ran exactly L1's ops";
  EXPECT_LE(r.mean_kl, 1e-3);
  EXPECT_GE(r.top1_agree, 0.98);
  RecordProperty("mean_kl", std::to_string(r.mean_kl));
  RecordProperty("top1_agree", std::to_string(r.top1_agree));
  {  // The same text on MLX's weight layout: the float32 kernel for the 512-token forward.
    const test::MlxLayoutScope mlx_layout;
    const auto rf = test::compare_teacher_forced(*exact.model, *fast.model, ids);
    EXPECT_LE(rf.mean_kl, 1e-3);
    EXPECT_GE(rf.top1_agree, 0.98);
    RecordProperty("float_kernel_mean_kl", std::to_string(rf.mean_kl));
  }
  // The same text in decode-sized steps (1 to kInt8MaxRows tokens): the int8-activation path.
  // Its first 256 tokens (L1 in small steps is the suite's slowest part); LMX_HEAVY=1: all 512.
  const char* heavy = std::getenv("LMX_HEAVY");
  const std::vector<int> step_ids(ids.begin(),
                                  ids.begin() + (heavy && std::string(heavy) == "1" ? 512 : 256));
  const auto rs = test::compare_teacher_forced_steps(*exact.model, *fast.model, step_ids,
                                                     kernels::cpu::kInt8MaxRows);
  EXPECT_LE(rs.mean_kl, 1e-3);
  EXPECT_GE(rs.top1_agree, 0.98);
  RecordProperty("steps_mean_kl", std::to_string(rs.mean_kl));
  RecordProperty("steps_top1_agree", std::to_string(rs.top1_agree));

  const std::vector<std::string> prompts = {
      "What is the capital of France? Answer in one sentence.",
      "Write a haiku about the sea.",
      "Explain what a hash table is to a beginner.",
      "List three uses of copper.",
  };
  int same = 0;
  for (const auto& p : prompts) {
    const auto prompt = tok.encode(chat(p));
    same += test::greedy(*exact.model, prompt, 64) == test::greedy(*fast.model, prompt, 64);
  }
  EXPECT_GE(same, 3) << "greedy outputs identical to L1 on " << same << " of 4 prompts";
}

TEST(TiersSmolLM2, SameTokensForEveryThreadCountAndTheAvx2Kernel) {
  const std::string args = "generate --model " + model_dir().string() +
                           " --max-tokens 32 --ignore-chat-template --prompt 'Name a color.'";
  const auto base = test::run_lmx(args);
  ASSERT_EQ(base.exit_code, 0) << base.err;
  for (const char* env : {"LMX_CPU_THREADS=1", "LMX_CPU_THREADS=3", "LMX_CPU_ISA=avx2",
                          "LMX_CPU_ISA=avx2 LMX_CPU_THREADS=1"}) {
    const auto r = test::run_lmx_env(env, args);
    ASSERT_EQ(r.exit_code, 0) << env << ": " << r.err;
    if (std::string(env).find("avx2") == std::string::npos) {
      EXPECT_EQ(r.out, base.out) << env;  // the same kernel: bit-identical
    }
  }
  // The AVX2 kernel sums in 8 lanes, not 16: its tokens are compared run against run, and its
  // tier line must name it.
  const auto a1 = test::run_lmx_env("LMX_CPU_ISA=avx2", args);
  const auto a2 = test::run_lmx_env("LMX_CPU_ISA=avx2 LMX_CPU_THREADS=1", args);
  EXPECT_EQ(a1.out, a2.out);
  const auto v = test::run_lmx_env("LMX_CPU_ISA=avx2", "--version");
  EXPECT_NE(v.out.find("L3 (lmx CPU kernels: avx2"), std::string::npos) << v.out;
  const auto bad = test::run_lmx_env("LMX_CPU_ISA=sse9", args);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("expected avx512, avx2 or generic"), std::string::npos) << bad.err;
  // Where on by default, the --version line names the path, and `off` (an environment setting)
  // drops the name and gives the same text for 1 and 2 threads.
  auto switchable = [&](bool on, const std::string& name, const std::string& off) {
    if (!on) return;
    EXPECT_NE(test::run_lmx("--version").out.find(name), std::string::npos) << name;
    const auto v = test::run_lmx_env(off, "--version");
    EXPECT_EQ(v.out.find(name), std::string::npos) << v.out;
    const auto r1 = test::run_lmx_env(off, args);
    const auto r2 = test::run_lmx_env(off + " LMX_CPU_THREADS=1", args);
    ASSERT_EQ(r1.exit_code, 0) << r1.err;
    EXPECT_EQ(r1.out, r2.out) << off;
  };
  namespace kc = kernels::cpu;
  // The int8 path where a VNNI kernel exists; the packed layout where its kernel exists.
  switchable(!kc::int8_kernel_name(kc::active_isa()).empty(), " + int8 ", "LMX_CPU_INT8=0");
  switchable(kc::int8_packed(kc::active_isa()), " packed (all rows)", "LMX_CPU_PACK=0");
  const auto badp = test::run_lmx_env("LMX_CPU_PACK=yes", args);
  EXPECT_EQ(badp.exit_code, 1);
  EXPECT_NE(badp.err.find("expected 0 or 1"), std::string::npos) << badp.err;
  const auto bad8 = test::run_lmx_env("LMX_CPU_INT8=yes", args);
  EXPECT_EQ(bad8.exit_code, 1);
  EXPECT_NE(bad8.err.find("expected 0, 1 or all"), std::string::npos) << bad8.err;
}

}  // namespace
}  // namespace lmx
