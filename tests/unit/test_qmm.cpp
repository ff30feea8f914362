// The L3 CPU quantized matmul against the plain-MLX computation (dequantize in float32, then
// matmul) on random inputs: every bits / group size / scale dtype, odd row counts, every ISA the
// CPU has (avx512, avx2 and generic on this project's x86 machines).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/qmm.h"

namespace lmx {
namespace {

namespace kc = kernels::cpu;
namespace mx = mlx::core;

std::vector<kc::Isa> isas() {
  std::vector<kc::Isa> out;
  for (kc::Isa i : {kc::Isa::avx512, kc::Isa::avx2, kc::Isa::generic})
    if (kc::isa_available(i)) out.push_back(i);
  return out;
}

struct Quantized {
  mx::array w{0}, scales{0}, biases{0};
};

Quantized quantize(int N, int K, int gs, int bits, mx::Dtype scale_dtype, uint64_t seed) {
  mx::array wf = mx::astype(
      mx::random::normal({N, K}, mx::float32, 0.0f, 0.05f, mx::random::key(seed)), scale_dtype);
  auto q = mx::quantize(wf, gs, bits);
  return {q[0], q[1], q[2]};
}

// max over elements of |got - want| / (|want| + 1e-3 * max|want|): within bf16 output rounding
// (2^-8) when the kernel is right.
double rel_error(const mx::array& got, const mx::array& want) {
  mx::array g = mx::astype(got, mx::float32), w = mx::astype(want, mx::float32);
  mx::array floor = mx::multiply(mx::max(mx::abs(w)), mx::array(1e-3f));
  return mx::max(mx::divide(mx::abs(mx::subtract(g, w)), mx::add(mx::abs(w), floor))).item<float>();
}

constexpr double kBf16Rounding = 1.0 / 256;

using Layout = std::tuple<int, int, mx::Dtype>;  // bits, group size, scale dtype

class QmmLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(QmmLayouts, MatchesDequantizeMatmulInFloat32) {
  const auto [bits, gs, sdt] = GetParam();
  ASSERT_TRUE(kc::supports(bits, gs, "affine", sdt));
  uint64_t seed = 1;
  // (M, N, K): single rows (decode), odd counts, a row count past the 4-row weight block, a wide
  // decode layer (64-row tasks).
  const std::vector<std::tuple<int, int, int>> shapes = {
      {1, 1, 128},   {1, 7, 256},   {3, 17, 384},  {5, 64, 128},
      {33, 21, 512}, {2, 129, 256}, {1, 1031, 128}};
  for (kc::Isa isa : isas()) {
    for (auto [M, N, K] : shapes) {
      if (K % gs) continue;
      Quantized q = quantize(N, K, gs, bits, sdt, seed++);
      for (mx::Dtype xdt : {mx::float32, mx::bfloat16}) {
        mx::array x =
            mx::astype(mx::random::normal({M, K}, mx::float32, mx::random::key(seed++)), xdt);
        mx::array got = kc::quantized_matmul(
            x, q.w, q.scales, q.biases,
            {.group_size = gs, .bits = bits, .isa = isa, .out_dtype = std::nullopt});
        mx::array want = kc::quantized_matmul_reference(x, q.w, q.scales, q.biases, gs, bits);
        ASSERT_EQ(got.shape(), (mx::Shape{M, N}));
        ASSERT_EQ(got.dtype(), mx::promote_types(xdt, sdt));
        EXPECT_LE(rel_error(got, want), kBf16Rounding)
            << kc::isa_name(isa) << " M=" << M << " N=" << N << " K=" << K << " x " << xdt;
      }
    }
  }
}

std::string layout_name(const ::testing::TestParamInfo<Layout>& p) {
  const auto [bits, gs, sdt] = p.param;
  const char* s = sdt == mx::float32 ? "f32" : sdt == mx::bfloat16 ? "bf16" : "f16";
  return "b" + std::to_string(bits) + "_g" + std::to_string(gs) + "_" + s;
}

INSTANTIATE_TEST_SUITE_P(
    All, QmmLayouts,
    ::testing::Combine(::testing::Values(2, 3, 4, 5, 6, 8), ::testing::Values(32, 64, 128),
                       ::testing::Values(mx::float32, mx::bfloat16, mx::float16)),
    layout_name);

TEST(Qmm, BatchedAndStridedInputs) {
  Quantized q = quantize(48, 256, 64, 4, mx::bfloat16, 7);
  // (B, L, K) input and a transposed (non-contiguous) one.
  mx::array x3 = mx::random::normal({2, 3, 256}, mx::float32, mx::random::key(8));
  mx::array xt = mx::transpose(mx::random::normal({256, 5}, mx::float32, mx::random::key(9)));
  for (kc::Isa isa : isas()) {
    for (const mx::array& x : {x3, xt}) {
      mx::array got = kc::quantized_matmul(
          x, q.w, q.scales, q.biases,
          {.group_size = 64, .bits = 4, .isa = isa, .out_dtype = std::nullopt});
      mx::array want = kc::quantized_matmul_reference(x, q.w, q.scales, q.biases, 64, 4);
      ASSERT_EQ(got.shape(), want.shape());
      EXPECT_LE(rel_error(got, want), kBf16Rounding) << kc::isa_name(isa);
    }
  }
}

TEST(Qmm, DeterministicAcrossRunsAndIsasAgree) {
  Quantized q = quantize(300, 512, 32, 4, mx::float32, 11);
  mx::array x = mx::random::normal({4, 512}, mx::float32, mx::random::key(12));
  const kc::QmmOptions opt{
      .group_size = 32, .bits = 4, .isa = std::nullopt, .out_dtype = std::nullopt};
  mx::array first = kc::quantized_matmul(x, q.w, q.scales, q.biases, opt);
  mx::eval(first);
  for (int i = 0; i < 5; ++i) {
    mx::array again = kc::quantized_matmul(x, q.w, q.scales, q.biases, opt);
    EXPECT_TRUE(mx::array_equal(first, again).item<bool>()) << "run " << i;
  }
}

TEST(Qmm, BadInputIsAnError) {
  Quantized q = quantize(8, 128, 64, 4, mx::float32, 13);
  mx::array x = mx::zeros({1, 128});
  const kc::QmmOptions opt{
      .group_size = 64, .bits = 4, .isa = std::nullopt, .out_dtype = std::nullopt};
  EXPECT_THROW(kc::quantized_matmul(mx::zeros({1, 64}), q.w, q.scales, q.biases, opt), Error);
  EXPECT_THROW(kc::quantized_matmul(
                   x, q.w, q.scales, q.biases,
                   {.group_size = 16, .bits = 4, .isa = std::nullopt, .out_dtype = std::nullopt}),
               Error);
  EXPECT_THROW(kc::quantized_matmul(
                   x, q.w, q.scales, q.biases,
                   {.group_size = 64, .bits = 7, .isa = std::nullopt, .out_dtype = std::nullopt}),
               Error);
  EXPECT_THROW(kc::quantized_matmul(x, q.w, mx::transpose(q.scales), q.biases, opt), Error);
  EXPECT_THROW(kc::quantized_matmul(mx::zeros({1, 128}, mx::int32), q.w, q.scales, q.biases, opt),
               Error);
}

}  // namespace
}  // namespace lmx
