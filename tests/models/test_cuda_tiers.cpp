// Tier L3 on the GPU (lmx's CUDA quantized GEMV, kernels/cuda/qmm.h) against tier L1 on the GPU
// (stock MLX, bit-exact with mlx-lm) on the parity rows whose widths MLX's CUDA quantized kernels
// take (`_a512_` / `_a1024_`, scripts/gen_tiny_models.py) and whose layout L3 routes to the kernel
// (kernels::cuda::routed: not group 32): teacher-forced next-token distributions
// through decode-sized steps (1 to kMaxRows tokens, the calls the kernel takes) with mean KL
// <= 1e-3 and top-1 agreement >= 99%, and greedy outputs. CUDA builds only (tests/CMakeLists.txt);
// run on the GPU machine by scripts/gpu/test.sh.
#include <gtest/gtest.h>
#include <mlx/graph_utils.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "core/json.h"
#include "kernels/cuda/qmm.h"
#include "kernels/cuda/routing.h"
#include "models/model.h"
#include "test_util.h"
#include "tier_gate.h"

namespace lmx {
namespace {

namespace fs = std::filesystem;
namespace mx = mlx::core;

fs::path parity_dir() {
  const char* env = std::getenv("LMX_TEST_DATA");
  return (env ? fs::path(env) : fs::path(LMX_DEFAULT_TEST_DATA)) / "parity";
}

std::vector<std::string> cuda_rows() {
  std::vector<std::string> rows;
  try {
    json meta = read_json_file(parity_dir() / "index.json");
    for (const auto& row : meta.at("rows")) {
      const auto name = row.at("name").get<std::string>();
      const auto& q = row.at("quantization");
      if (!q.is_null() && row.at("kv_cache").is_null() &&
          kernels::cuda::routed(q.at("bits").get<int>(), q.at("group_size").get<int>()) &&
          (name.find("_a512_") != std::string::npos || name.find("_a1024_") != std::string::npos))
        rows.push_back(name);
    }
  } catch (const std::exception&) {
    rows.clear();
  }
  if (rows.empty()) rows.emplace_back("missing_parity_index");
  return rows;
}

class CudaTiers : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kernels::cuda::available()) << "a CUDA build must run on the GPU";
    dir_ = test::data_path("parity/" + GetParam());
    ASSERT_TRUE(fs::is_directory(dir_));
    exact_ = load_model(dir_, {.exact = true});
    fast_ = load_model(dir_);
    ASSERT_FALSE(exact_.cuda_kernels);
    ASSERT_TRUE(fast_.cuda_kernels) << "the default load must select tier L3 on the GPU";
    vocab_ = exact_.info.config.at("vocab_size").get<int>();
  }
  fs::path dir_;
  LoadedWeights exact_, fast_;
  int vocab_ = 0;
};

TEST_P(CudaTiers, TeacherForcedInDecodeStepsAgree) {
  const auto tokens = test::random_tokens(512, vocab_, std::hash<std::string>{}(GetParam()));
  const auto r = test::compare_teacher_forced_steps(*exact_.model, *fast_.model, tokens,
                                                    kernels::cuda::kMaxRows);
  EXPECT_GT(r.max_abs_diff, 0) << "L3 ran exactly L1's ops: no layer of this row is on the kernel";
  EXPECT_LE(r.mean_kl, 1e-3);
  EXPECT_GE(r.top1_agree, 0.99);
  RecordProperty("mean_kl", std::to_string(r.mean_kl));
  RecordProperty("top1_agree", std::to_string(r.top1_agree));
  std::printf("[ gate ] %s mean_kl=%.3g top1=%.4f positions=%d\n", GetParam().c_str(), r.mean_kl,
              r.top1_agree, r.positions);
}

TEST_P(CudaTiers, GreedyOutputsAgree) {
  int same = 0;
  for (unsigned p = 0; p < 4; ++p) {
    const auto prompt = test::random_tokens(12, vocab_, 1000 + p);
    same += test::greedy(*exact_.model, prompt, 64) == test::greedy(*fast_.model, prompt, 64);
  }
  EXPECT_GE(same, 3) << "greedy outputs identical to L1 on " << same << " of 4 prompts";
}

TEST_P(CudaTiers, FastTierIsDeterministic) {
  const auto prompt = test::random_tokens(12, vocab_, 7);
  EXPECT_EQ(test::greedy(*fast_.model, prompt, 16), test::greedy(*fast_.model, prompt, 16));
}

// A decode step of the dense decoder families runs the fused kernels (kernels/cuda/qmm.h): q/k/v
// in one launch, the o and down projections with their residual adds, gate and up with SiLU,
// and after fused q/k/v the q/k norms (qwen3) and RoPE in one kernel; the layers' RMSNorms go
// into the q/k/v and gate/up kernels. qwen2's q/k/v carry biases
// and stay separate; gemma3 has no fused CUDA layer.
TEST_P(CudaTiers, DecodeStepRunsTheFusedKernels) {
  const std::string row = GetParam();
  const bool qwen2 = row.rfind("qwen2", 0) == 0, gemma3 = row.rfind("gemma3", 0) == 0;
  const int matmuls = qwen2 ? 3 : gemma3 ? 0 : 4, rope = qwen2 || gemma3 ? 0 : 1;
  Model& m = *fast_.model;
  Cache cache = m.make_cache();
  mx::eval(m(mx::array({1, 2, 3, 4}, {1, 4}), cache));
  std::ostringstream dot;
  mx::export_to_dot(dot, {m(mx::array({5}, {1, 1}), cache)});
  const std::string text = dot.str();
  auto count = [&](const std::string& name) {
    const std::string needle = "label =\"" + name + "\"";
    int n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
      ++n;
    return n;
  };
  EXPECT_EQ(count("LmxCudaQmvFused"), matmuls * m.num_layers()) << row;
  EXPECT_EQ(count("LmxCudaQkRope"), rope * m.num_layers()) << row;
  if (rope) {
    EXPECT_EQ(count("RoPE"), 0) << row << ": every rotation in lmx's kernel";
    // The layers' norms in the kernels that read them (routing.h norm_fold_routed): the model's
    // final norm is left.
    if (kernels::cuda::norm_fold_routed()) {
      EXPECT_EQ(count("RMSNorm"), 1) << row;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, CudaTiers, ::testing::ValuesIn(cuda_rows()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lmx
