// The L3 CPU quantized matmul against the plain-MLX computation (dequantize in float32, then
// matmul) on random inputs: every bits / group size / scale dtype, odd row counts, every ISA the
// CPU has (avx512, avx2 and generic on this project's x86 machines).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
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

// float32 outputs: both sides accumulate float32 products in float32, only in different orders,
// so they agree to a few float32 roundings of the largest |value| (worst seen: 1.11e-6 at
// K = 512, about 19 roundings of 2^-24).
double error_to_largest(const mx::array& got, const mx::array& want) {
  return mx::divide(mx::max(mx::abs(mx::subtract(got, want))), mx::max(mx::abs(want)))
      .item<float>();
}
constexpr double kF32Accumulation = 2e-6;

// Within float32 accumulation for a float32 output, within bf16 rounding otherwise.
void expect_matches(const mx::array& got, const mx::array& want, const std::string& where) {
  if (got.dtype() == mx::float32) {
    ASSERT_EQ(want.dtype(), mx::float32) << where;
    EXPECT_LE(error_to_largest(got, want), kF32Accumulation) << where;
  } else {
    EXPECT_LE(rel_error(got, want), kBf16Rounding) << where;
  }
}

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
        mx::array got = kc::quantized_matmul(x, q.w, q.scales, q.biases,
                                             {.group_size = gs,
                                              .bits = bits,
                                              .isa = isa,
                                              .out_dtype = std::nullopt,
                                              .int8 = kc::Int8Mode::off});
        mx::array want = kc::quantized_matmul_reference(x, q.w, q.scales, q.biases, gs, bits);
        ASSERT_EQ(got.shape(), (mx::Shape{M, N}));
        ASSERT_EQ(got.dtype(), mx::promote_types(xdt, sdt));
        std::ostringstream where;
        where << kc::isa_name(isa) << " M=" << M << " N=" << N << " K=" << K << " x " << xdt;
        expect_matches(got, want, where.str());
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
      mx::array got = kc::quantized_matmul(x, q.w, q.scales, q.biases,
                                           {.group_size = 64,
                                            .bits = 4,
                                            .isa = isa,
                                            .out_dtype = std::nullopt,
                                            .int8 = kc::Int8Mode::off});
      mx::array want = kc::quantized_matmul_reference(x, q.w, q.scales, q.biases, 64, 4);
      ASSERT_EQ(got.shape(), want.shape());
      ASSERT_EQ(got.dtype(), mx::float32);
      expect_matches(got, want, kc::isa_name(isa));
    }
  }
}

TEST(Qmm, DeterministicAcrossRunsAndIsasAgree) {
  Quantized q = quantize(300, 512, 32, 4, mx::float32, 11);
  mx::array x = mx::random::normal({4, 512}, mx::float32, mx::random::key(12));
  for (kc::Int8Mode int8 : {kc::Int8Mode::off, kc::Int8Mode::all}) {
    const kc::QmmOptions opt{
        .group_size = 32, .bits = 4, .isa = std::nullopt, .out_dtype = std::nullopt, .int8 = int8};
    mx::array first = kc::quantized_matmul(x, q.w, q.scales, q.biases, opt);
    mx::eval(first);
    for (int i = 0; i < 5; ++i) {
      mx::array again = kc::quantized_matmul(x, q.w, q.scales, q.biases, opt);
      EXPECT_TRUE(mx::array_equal(first, again).item<bool>()) << "run " << i;
    }
  }
}

// The kernels the loops above run under each ISA of the CPU: one test per compiled ISA that is
// skipped, with the reason in the output, where this CPU lacks it (those kernels went untested).
using IsaPath = std::tuple<kc::Isa, bool>;  // ISA, int8 path

class CpuIsa : public ::testing::TestWithParam<IsaPath> {};

TEST_P(CpuIsa, KernelsTestedOnThisCpu) {
  const auto [isa, int8] = GetParam();
  if (!kc::isa_available(isa))
    GTEST_SKIP() << "this CPU has no " << kc::isa_name(isa) << ": its " << (int8 ? "int8 " : "")
                 << "kernels were not tested here";
  if (int8 && kc::int8_kernel_name(isa).empty())
    GTEST_SKIP() << "this CPU has " << kc::isa_name(isa) << " but not its VNNI extension: the "
                 << "int8 kernel for it was not tested here";
  const std::vector<kc::Isa> tested = isas();
  EXPECT_TRUE(std::find(tested.begin(), tested.end(), isa) != tested.end());
}

INSTANTIATE_TEST_SUITE_P(All, CpuIsa,
                         ::testing::Combine(::testing::Values(kc::Isa::avx512, kc::Isa::avx2),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<IsaPath>& p) {
                           return kc::isa_name(std::get<0>(p.param)) +
                                  (std::get<1>(p.param) ? "_int8" : "");
                         });

// The int8 path (QmmI8Args) under each ISA that has an int8 kernel: avx512 -> AVX512-VNNI,
// avx2 -> AVX-VNNI, else AVX2's vpmaddubsw (4-bit weights).
std::vector<kc::Isa> int8_isas() {
  std::vector<kc::Isa> out;
  for (kc::Isa i : {kc::Isa::avx512, kc::Isa::avx2})
    if (kc::isa_available(i) && !kc::int8_kernel_name(i).empty()) out.push_back(i);
  return out;
}

// The int8 path's arithmetic in plain MLX float32 ops: x quantized per block of 32 to two limbs
// exactly as the kernel does (the same IEEE operations: id = 127 / amax, d = amax / 127, q1 =
// round(x * id), q2 = round((x - q1 * d) * (id * 128)), xhat = (128 q1 + q2) * (d / 128)), then
// xhat @ dequantize(w).T.
mx::array int8_reference(const mx::array& x, const Quantized& q, int gs, int bits) {
  const int M = x.shape(0), K = x.shape(1);
  mx::array xf = mx::reshape(mx::astype(x, mx::float32), {M, K / 32, 32});
  mx::array amax = mx::max(mx::abs(xf), -1, true);
  mx::array id = mx::where(mx::greater(amax, mx::array(0.0f)), mx::divide(mx::array(127.0f), amax),
                           mx::array(0.0f));
  mx::array d = mx::divide(amax, mx::array(127.0f));
  mx::array q1 = mx::round(mx::multiply(xf, id));
  mx::array r = mx::subtract(xf, mx::multiply(q1, d));
  mx::array q2 = mx::round(mx::multiply(r, mx::multiply(id, mx::array(128.0f))));
  mx::array xhat = mx::multiply(mx::add(mx::multiply(q1, mx::array(128.0f)), q2),
                                mx::divide(d, mx::array(128.0f)));
  mx::array wf = mx::dequantize(q.w, mx::astype(q.scales, mx::float32),
                                mx::astype(q.biases, mx::float32), gs, bits);
  return mx::matmul(mx::reshape(xhat, {M, K}), mx::transpose(wf));
}

class QmmInt8Layouts : public ::testing::TestWithParam<Layout> {};

TEST_P(QmmInt8Layouts, MatchesInt8ArithmeticAndStaysWithinTheQuantizationBound) {
  const auto [bits, gs, sdt] = GetParam();
  if (int8_isas().empty())
    GTEST_SKIP() << "this CPU has no int8 kernel (AVX512-VNNI, AVX-VNNI or AVX2)";
  uint64_t seed = 100;
  // (M, N, K): decode rows, odd row counts around the 2-row and 4-row blocks, K with a 32-input
  // tail after the 64-input vectors (96, 160, 224), a wide decode layer (64-row tasks); batch
  // steps and prefills (AVX2's 8-row tiles: N not a multiple of 8, M past a 32-row pass).
  const std::vector<std::tuple<int, int, int>> shapes = {
      {1, 1, 128},     {1, 7, 96},    {2, 17, 256},   {3, 5, 160},    {5, 64, 384},
      {8, 9, 224},     {9, 33, 512},  {1, 1031, 576}, {4, 130, 1536}, {16, 43, 576},
      {16, 1030, 192}, {33, 21, 256}, {70, 16, 128}};
  float worst = 0;
  // Both weight layouts of the 512-bit kernel: MLX's and its packed copy.
  const bool packing = kc::packing();
  std::vector<std::pair<kc::Isa, bool>> runs;
  for (bool pack : {false, true})
    for (kc::Isa isa : int8_isas())
      if (bits <= kc::int8_max_bits(isa)) runs.emplace_back(isa, pack);
  if (runs.empty())
    GTEST_SKIP() << "this CPU's int8 kernel (" << kc::int8_kernel_name(int8_isas().front())
                 << ") takes weights up to " << kc::int8_max_bits(int8_isas().front()) << " bits; "
                 << bits << "-bit ones take the float kernel";
  for (auto [isa, pack] : runs) {
    kc::set_packing(pack);
    for (auto [M, N, K] : shapes) {
      if (K % gs) continue;
      Quantized q = quantize(N, K, gs, bits, sdt, seed++);
      for (mx::Dtype xdt : {mx::float32, mx::bfloat16}) {
        mx::array x =
            mx::astype(mx::random::normal({M, K}, mx::float32, mx::random::key(seed++)), xdt);
        mx::array got = kc::quantized_matmul(x, q.w, q.scales, q.biases,
                                             {.group_size = gs,
                                              .bits = bits,
                                              .isa = isa,
                                              .out_dtype = mx::float32,
                                              .int8 = kc::Int8Mode::all});
        const std::string where = kc::int8_kernel_name(isa) + (pack ? " packed" : "") +
                                  " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                                  " K=" + std::to_string(K);
        // 1. The kernel computes the int8 arithmetic it stands for: only the float32
        //    accumulation order differs, so within the float kernel's bound.
        EXPECT_LE(rel_error(got, int8_reference(x, q, gs, bits)), kBf16Rounding) << where;
        // 2. Against the float32 computation: got - want = sum_k w_k (xhat_k - x_k). Rounding
        //    to the nearest step d = amax / 127, then the remainder to the nearest d / 128,
        //    leaves |x_k - xhat_k| <= amax / 32512 (plus the float32 rounding of the remainder,
        //    ~2^-24 amax, well inside 1%). So |got - want| <= 1.01 * sum_k (amax_k / 32512) |w_k|.
        mx::array want = kc::quantized_matmul_reference(x, q.w, q.scales, q.biases, gs, bits);
        mx::array xf = mx::reshape(mx::astype(x, mx::float32), {M, K / 32, 32});
        mx::array half_step = mx::reshape(
            mx::broadcast_to(mx::divide(mx::max(mx::abs(xf), -1, true), mx::array(127.0f * 256)),
                             {M, K / 32, 32}),
            {M, K});
        mx::array wabs = mx::abs(mx::dequantize(q.w, mx::astype(q.scales, mx::float32),
                                                mx::astype(q.biases, mx::float32), gs, bits));
        mx::array bound =
            mx::multiply(mx::matmul(half_step, mx::transpose(wabs)), mx::array(1.01f));
        mx::array err = mx::abs(mx::subtract(got, want));
        EXPECT_TRUE(mx::all(mx::less_equal(err, bound)).item<bool>())
            << where << ": max excess " << mx::max(mx::subtract(err, bound)).item<float>();
        // 3. Typical error: each x_k moves by a roughly uniform error of std step / sqrt(12),
        //    step = amax / (127 * 128) ~ 2.5 sigma / 16256 for normal x over 32 inputs, and the
        //    w_k are centred, so the output's RMS error is ~4.4e-5 of its RMS (4-bit and 8-bit
        //    alike); 2^-13 (1.2e-4) fails a kernel that drops a limb (~0.6%), a block, a scale
        //    or the bias term. A statistic, so over at least 32 outputs.
        const float rms_err =
            std::sqrt(mx::mean(mx::square(mx::subtract(got, want))).item<float>());
        const float rms = std::sqrt(mx::mean(mx::square(want)).item<float>());
        if (M * N < 32) continue;
        worst = std::max(worst, rms_err / rms);
        EXPECT_LE(rms_err, rms / 8192) << where;
      }
    }
  }
  kc::set_packing(packing);
  RecordProperty("worst_rms_ratio", std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(All, QmmInt8Layouts,
                         ::testing::Combine(::testing::Values(4, 8), ::testing::Values(32, 64, 128),
                                            ::testing::Values(mx::float32, mx::bfloat16,
                                                              mx::float16)),
                         layout_name);

// 5- and 6-bit weights on the int8 path through their byte-wide copy (widened_weight), against
// mx::quantized_matmul (float32 x and scales: MLX accumulates in float32) with the int8 tests'
// bounds; the result is the 8-bit int8 path's on the same integers (the widened path ran), differs
// from the float kernel's, and LMX_CPU_WIDEN's off state gives the float kernel's.
class QmmWidened : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(QmmWidened, FiveAndSixBitTakeTheInt8PathWithinItsBounds) {
  const auto [bits, gs] = GetParam();
  if (int8_isas().empty())
    GTEST_SKIP() << "this CPU has no int8 kernel (AVX512-VNNI, AVX-VNNI or AVX2)";
  ASSERT_TRUE(kc::widening()) << "LMX_CPU_WIDEN=0 set for the unit tests";
  const bool packing = kc::packing();
  uint64_t seed = 300 + 10 * bits + gs;
  for (bool pack : {false, true}) {
    kc::set_packing(pack);
    for (kc::Isa isa : int8_isas()) {
      for (auto [N, K] : {std::pair{67, 384}, std::pair{1030, 640}}) {
        if (K % gs) continue;
        Quantized q = quantize(N, K, gs, bits, mx::float32, seed++);
        // The same integers as an 8-bit weight, one byte each: dequantize with scale 1, bias 0.
        mx::array ints =
            mx::dequantize(q.w, mx::ones_like(q.scales), mx::zeros_like(q.biases), gs, bits);
        mx::array w8 = mx::view(mx::astype(ints, mx::uint8), mx::uint32);
        for (int M : {1, 4, 16, 64}) {
          mx::array x = mx::random::normal({M, K}, mx::float32, mx::random::key(seed++));
          auto run = [&](const mx::array& w, int b, kc::Int8Mode m) {
            return kc::quantized_matmul(
                x, w, q.scales, q.biases,
                {.group_size = gs, .bits = b, .isa = isa, .out_dtype = mx::float32, .int8 = m});
          };
          const mx::array got = run(q.w, bits, kc::Int8Mode::all);
          const std::string where = kc::int8_kernel_name(isa) + (pack ? " packed" : "") +
                                    " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                                    " K=" + std::to_string(K);
          EXPECT_TRUE(mx::array_equal(got, run(w8, 8, kc::Int8Mode::all)).item<bool>()) << where;
          const mx::array flt = run(q.w, bits, kc::Int8Mode::off);
          EXPECT_FALSE(mx::array_equal(got, flt).item<bool>()) << where;
          if (M <= kc::kInt8MaxRows || kc::int8_all_rows(isa)) {
            EXPECT_TRUE(mx::array_equal(run(q.w, bits, kc::Int8Mode::best), got).item<bool>())
                << where;
          }
          kc::set_widening(false);
          EXPECT_TRUE(mx::array_equal(run(q.w, bits, kc::Int8Mode::all), flt).item<bool>())
              << where;
          kc::set_widening(true);
          // The bounds of MatchesInt8ArithmeticAndStaysWithinTheQuantizationBound.
          EXPECT_LE(rel_error(got, int8_reference(x, q, gs, bits)), kBf16Rounding) << where;
          const mx::array want =
              mx::quantized_matmul(x, q.w, q.scales, q.biases, true, gs, bits, "affine");
          ASSERT_EQ(want.dtype(), mx::float32);
          mx::array xf = mx::reshape(x, {M, K / 32, 32});
          mx::array half_step = mx::reshape(
              mx::broadcast_to(mx::divide(mx::max(mx::abs(xf), -1, true), mx::array(127.0f * 256)),
                               {M, K / 32, 32}),
              {M, K});
          mx::array wabs = mx::abs(mx::dequantize(q.w, q.scales, q.biases, gs, bits));
          mx::array bound =
              mx::multiply(mx::matmul(half_step, mx::transpose(wabs)), mx::array(1.01f));
          mx::array err = mx::abs(mx::subtract(got, want));
          EXPECT_TRUE(mx::all(mx::less_equal(err, bound)).item<bool>())
              << where << ": max excess " << mx::max(mx::subtract(err, bound)).item<float>();
          const float rms_err =
              std::sqrt(mx::mean(mx::square(mx::subtract(got, want))).item<float>());
          const float rms = std::sqrt(mx::mean(mx::square(want)).item<float>());
          EXPECT_LE(rms_err, rms / 8192) << where;
        }
      }
    }
  }
  kc::set_packing(packing);
}

INSTANTIATE_TEST_SUITE_P(All, QmmWidened,
                         ::testing::Combine(::testing::Values(5, 6),
                                            ::testing::Values(32, 64, 128)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& p) {
                           return "b" + std::to_string(std::get<0>(p.param)) + "_g" +
                                  std::to_string(std::get<1>(p.param));
                         });

// The packed copy follows its weight, not its address: a weight whose buffer takes a freed
// one's memory gets its own copy, and a weight that lives on keeps giving its own result.
TEST(QmmInt8, PackedCopiesFollowTheirWeights) {
  if (int8_isas().empty())
    GTEST_SKIP() << "this CPU has no int8 kernel (AVX512-VNNI, AVX-VNNI or AVX2)";
  const int N = 48, K = 256, gs = 32;
  Quantized a = quantize(N, K, gs, 4, mx::float16, 1), b = quantize(N, K, gs, 4, mx::float16, 2);
  mx::eval(a.w, a.scales, a.biases, b.w, b.scales, b.biases);
  const size_t packed = static_cast<size_t>(N) * K / 2 + static_cast<size_t>(4) * N * (K / gs);
  auto bytes = [&](const kc::QWeight& w) {
    const unsigned char* p = kc::packed_weight(w);
    return std::vector<unsigned char>(p, p + packed);
  };
  const std::vector<unsigned char> pa = bytes(kc::qweight(a.w, a.scales, a.biases, gs, 4));
  const std::vector<unsigned char> pb = bytes(kc::qweight(b.w, b.scales, b.biases, gs, 4));
  ASSERT_NE(pa, pb);
  // One block of memory holding a's weight, then b's, each time under a new owner.
  std::vector<unsigned char> w(a.w.nbytes()), s(a.scales.nbytes()), z(a.biases.nbytes());
  auto at = [&](const Quantized& q, const std::shared_ptr<int>& owner) {
    std::memcpy(w.data(), q.w.data<void>(), w.size());
    std::memcpy(s.data(), q.scales.data<void>(), s.size());
    std::memcpy(z.data(), q.biases.data<void>(), z.size());
    return kc::QWeight{w.data(), s.data(), z.data(), kc::ScaleType::f16, N, K, gs, 4, owner};
  };
  auto owner = std::make_shared<int>(0);
  EXPECT_EQ(bytes(at(a, owner)), pa);
  owner = std::make_shared<int>(0);  // a's owner is gone; b's buffer has its address
  EXPECT_EQ(bytes(at(b, owner)), pb);
  EXPECT_EQ(bytes(kc::qweight(a.w, a.scales, a.biases, gs, 4)), pa) << "a live weight's copy";
}

// Issue 26: a 5/6-bit weight on the packed kernel is held once more, as its packed copy (5/6 bits
// a weight), not also as the byte-wide copy the packing reads (made for the packing only), at
// load and after calls of every row count; the results are the ones QmmWidened checks.
TEST(QmmInt8, PackedFiveAndSixBitWeightsKeepNoByteWideCopy) {
  if (!kc::int8_packed(kc::active_isa()) || kc::int8_max_bits(kc::active_isa()) < 8 ||
      kc::int8_mode() == kc::Int8Mode::off || !kc::widening())
    GTEST_SKIP() << "no packed int8 kernel here (AVX512-VNNI), or LMX_CPU_INT8/WIDEN/PACK off";
  for (int bits : {5, 6}) {
    const int N = 1030, K = 640, gs = 32;
    Quantized q = quantize(N, K, gs, bits, mx::float32, 40 + bits);
    mx::eval(q.w, q.scales, q.biases);
    const kc::KernelCopies before = kc::kernel_copies();
    kc::prepack(q.w, q.scales, q.biases, gs, bits);
    kc::KernelCopies after = kc::kernel_copies();
    EXPECT_EQ(after.widened, before.widened) << bits << "-bit: a byte-wide copy kept at load";
    // (Packing also drops the copies of freed weights: no exact growth to expect.)
    EXPECT_GE(after.packed, static_cast<size_t>(N) * K * bits / 8) << bits << "-bit: no copy";
    for (int M : {1, 64}) {
      mx::array x = mx::random::normal({M, K}, mx::float32, mx::random::key(M));
      mx::eval(kc::quantized_matmul(x, q.w, q.scales, q.biases,
                                    {.group_size = gs,
                                     .bits = bits,
                                     .isa = std::nullopt,
                                     .out_dtype = std::nullopt,
                                     .int8 = kc::Int8Mode::all}));
    }
    after = kc::kernel_copies();
    EXPECT_EQ(after.widened, before.widened) << bits << "-bit: a byte-wide copy made by a call";
  }
}

// Issue 26: a weight packed in place (the packed copy as the weight's only bytes; 5/6-bit ones
// packed from their byte-wide copy) gives every path the results of the weight it replaced, bit
// for bit: the packed kernel, and the float and unpacked int8 kernels (packing or the int8 path
// off after packing), which rebuild MLX's layout; packed_take's rows are mx::take's. Its bytes
// are counted while it lives.
TEST(QmmInt8, PackedInPlaceGivesTheWeightsResults) {
  if (!kc::int8_packed(kc::active_isa()) || kc::int8_mode() == kc::Int8Mode::off)
    GTEST_SKIP() << "no packed int8 kernel here (AVX512-VNNI), or LMX_CPU_INT8/PACK off";
  const kc::Isa isa = kc::active_isa();
  ASSERT_TRUE(kc::widening()) << "LMX_CPU_WIDEN=0 set for the unit tests";
  uint64_t seed = 500;
  for (int bits : {4, 5, 6, 8}) {
    for (int gs : {32, 64}) {
      for (mx::Dtype dt : {mx::float32, mx::float16, mx::bfloat16}) {
        const int N = 67, K = 256;  // a last block of 3 rows: padding
        Quantized q = quantize(N, K, gs, bits, dt, seed++);
        mx::eval(q.w, q.scales, q.biases);
        const size_t held = kc::kernel_copies().in_place;
        std::optional<mx::array> p = kc::pack_in_place(q.w, q.scales, q.biases, gs, bits);
        ASSERT_TRUE(p.has_value());
        EXPECT_TRUE(kc::packed_in_place(*p));
        EXPECT_FALSE(kc::packed_in_place(q.w));
        EXPECT_EQ(p->shape(), q.w.shape());
        EXPECT_GE(kc::kernel_copies().in_place, held + q.w.nbytes());
        const std::string where = std::to_string(bits) + "-bit g" + std::to_string(gs);
        for (int M : {1, 5, 64}) {
          mx::array x = mx::random::normal({M, K}, mx::float32, mx::random::key(seed++));
          for (kc::Int8Mode m : {kc::Int8Mode::all, kc::Int8Mode::best, kc::Int8Mode::off}) {
            for (bool pack : {true, false}) {
              kc::set_packing(pack);
              auto run = [&](const mx::array& w) {
                return kc::quantized_matmul(x, w, q.scales, q.biases,
                                            {.group_size = gs,
                                             .bits = bits,
                                             .isa = isa,
                                             .out_dtype = std::nullopt,
                                             .int8 = m});
              };
              const mx::array want = run(q.w), got = run(*p);
              kc::set_packing(true);
              EXPECT_TRUE(mx::array_equal(got, want).item<bool>())
                  << where << " M=" << M << " int8 " << static_cast<int>(m) << " packing " << pack;
            }
          }
        }
        const mx::array ids = mx::array({0, 66, 5, 16, 15, 5, 64}, {7}, mx::int32);
        EXPECT_TRUE(mx::array_equal(kc::packed_take(*p, ids), mx::take(q.w, ids, 0)).item<bool>())
            << where;
        const mx::array all = mx::reshape(mx::arange(N, mx::int32), {1, N});
        EXPECT_TRUE(mx::array_equal(kc::packed_take(*p, all), mx::take(q.w, all, 0)).item<bool>())
            << where;
        p.reset();
        EXPECT_EQ(kc::kernel_copies().in_place, held) << where << ": freed with its array";
      }
    }
  }
  kc::set_packing(true);
}

// The scales and biases dropped for stand-ins (scales_in_place): every path reads them from the
// packed copy, bit for bit as from MLX's arrays.
TEST(QmmInt8, ScalesInPlaceGiveTheWeightsResults) {
  if (!kc::int8_packed(kc::active_isa()) || kc::int8_mode() == kc::Int8Mode::off)
    GTEST_SKIP() << "no packed int8 kernel here (AVX512-VNNI), or LMX_CPU_INT8/PACK off";
  const kc::Isa isa = kc::active_isa();
  uint64_t seed = 900;
  for (int bits : {4, 5, 8}) {
    for (int gs : {32, 64}) {
      for (mx::Dtype dt : {mx::float32, mx::float16, mx::bfloat16}) {
        const int N = 67, K = 256;
        Quantized q = quantize(N, K, gs, bits, dt, seed++);
        mx::eval(q.w, q.scales, q.biases);
        EXPECT_FALSE(kc::scales_in_place(q.w).has_value()) << "not packed in place";
        std::optional<mx::array> p = kc::pack_in_place(q.w, q.scales, q.biases, gs, bits);
        ASSERT_TRUE(p.has_value());
        const size_t held = kc::kernel_copies().in_place;
        auto stand_ins = kc::scales_in_place(*p);
        ASSERT_TRUE(stand_ins.has_value());
        const auto& [s, b] = *stand_ins;
        const std::string where = std::to_string(bits) + "-bit g" + std::to_string(gs);
        EXPECT_EQ(s.shape(), q.scales.shape()) << where;
        EXPECT_EQ(b.shape(), q.biases.shape()) << where;
        EXPECT_EQ(s.dtype(), dt) << where;
        EXPECT_EQ(kc::kernel_copies().in_place, held) << where << ": stand-ins hold no copy";
        for (int M : {1, 5, 64}) {
          mx::array x = mx::random::normal({M, K}, mx::float32, mx::random::key(seed++));
          for (kc::Int8Mode m : {kc::Int8Mode::all, kc::Int8Mode::off}) {
            for (bool pack : {true, false}) {
              kc::set_packing(pack);
              const kc::QmmOptions o{
                  .group_size = gs, .bits = bits, .isa = isa, .out_dtype = std::nullopt, .int8 = m};
              const mx::array want = kc::quantized_matmul(x, q.w, q.scales, q.biases, o);
              const mx::array got = kc::quantized_matmul(x, *p, s, b, o);
              kc::set_packing(true);
              EXPECT_TRUE(mx::array_equal(got, want).item<bool>())
                  << where << " M=" << M << " int8 " << static_cast<int>(m) << " packing " << pack;
            }
          }
        }
        const mx::array ids = mx::array({0, 66, 5, 16, 15, -1}, {2, 3}, mx::int32);
        using kc::PackedPart;
        EXPECT_TRUE(mx::array_equal(kc::packed_take(*p, ids, PackedPart::scales),
                                    mx::take(q.scales, ids, 0))
                        .item<bool>())
            << where;
        EXPECT_TRUE(mx::array_equal(kc::packed_take(*p, ids, PackedPart::biases),
                                    mx::take(q.biases, ids, 0))
                        .item<bool>())
            << where;
      }
    }
  }
  kc::set_packing(true);
}

TEST(QmmInt8, OtherWidthsAndLargeCallsUseTheFloatKernel) {
  for (kc::Isa isa : int8_isas()) {
    // bits 3: no int8 path even when asked for every call.
    Quantized q3 = quantize(40, 256, 64, 3, mx::float32, 21);
    mx::array x = mx::random::normal({2, 256}, mx::float32, mx::random::key(22));
    auto run = [&](const Quantized& q, const mx::array& x, int bits, kc::Int8Mode m) {
      return kc::quantized_matmul(
          x, q.w, q.scales, q.biases,
          {.group_size = 64, .bits = bits, .isa = isa, .out_dtype = std::nullopt, .int8 = m});
    };
    EXPECT_TRUE(mx::array_equal(run(q3, x, 3, kc::Int8Mode::all), run(q3, x, 3, kc::Int8Mode::off))
                    .item<bool>());
    // 8-bit weights on the int8 path where the kernel takes them (every kernel today).
    Quantized q8 = quantize(40, 256, 64, 8, mx::float32, 25);
    const bool eight = kc::int8_max_bits(isa) >= 8;
    EXPECT_EQ(mx::array_equal(run(q8, x, 8, kc::Int8Mode::all), run(q8, x, 8, kc::Int8Mode::off))
                  .item<bool>(),
              !eight)
        << kc::int8_kernel_name(isa);
    // The default mode: int8 for every call on the packed layout and AVX2's tiles; on MLX's
    // layout otherwise for at most kInt8MaxRows rows, the float kernel above.
    const bool packing = kc::packing();
    Quantized q4 = quantize(40, 256, 64, 4, mx::float32, 23);
    for (bool pack : {false, true}) {
      kc::set_packing(pack);
      for (int M : {1, kc::kInt8MaxRows, kc::kInt8MaxRows + 1, 64}) {
        mx::array xm = mx::random::normal({M, 256}, mx::float32, mx::random::key(24 + M));
        mx::array best = run(q4, xm, 4, kc::Int8Mode::best);
        const bool int8 = M <= kc::kInt8MaxRows || kc::int8_all_rows(isa);
        mx::array expect = run(q4, xm, 4, int8 ? kc::Int8Mode::all : kc::Int8Mode::off);
        EXPECT_TRUE(mx::array_equal(best, expect).item<bool>()) << "M=" << M << " pack=" << pack;
        EXPECT_FALSE(
            mx::array_equal(run(q4, xm, 4, kc::Int8Mode::all), run(q4, xm, 4, kc::Int8Mode::off))
                .item<bool>())
            << "the int8 path must differ from the float one (it quantizes x)";
      }
    }
    EXPECT_EQ(kc::int8_packed(isa), kc::int8_kernel_name(isa) == "avx512vnni");
    EXPECT_EQ(kc::int8_all_rows(isa), kc::int8_packed(isa) || kc::int8_kernel_name(isa) == "avx2");
    kc::set_packing(packing);
  }
}

TEST(Qmm, BadInputIsAnError) {
  Quantized q = quantize(8, 128, 64, 4, mx::float32, 13);
  mx::array x = mx::zeros({1, 128});
  const kc::QmmOptions opt{.group_size = 64,
                           .bits = 4,
                           .isa = std::nullopt,
                           .out_dtype = std::nullopt,
                           .int8 = std::nullopt};
  EXPECT_THROW(kc::quantized_matmul(mx::zeros({1, 64}), q.w, q.scales, q.biases, opt), Error);
  EXPECT_THROW(kc::quantized_matmul(x, q.w, q.scales, q.biases,
                                    {.group_size = 16,
                                     .bits = 4,
                                     .isa = std::nullopt,
                                     .out_dtype = std::nullopt,
                                     .int8 = std::nullopt}),
               Error);
  EXPECT_THROW(kc::quantized_matmul(x, q.w, q.scales, q.biases,
                                    {.group_size = 64,
                                     .bits = 7,
                                     .isa = std::nullopt,
                                     .out_dtype = std::nullopt,
                                     .int8 = std::nullopt}),
               Error);
  EXPECT_THROW(kc::quantized_matmul(x, q.w, mx::transpose(q.scales), q.biases, opt), Error);
  EXPECT_THROW(kc::quantized_matmul(mx::zeros({1, 128}, mx::int32), q.w, q.scales, q.biases, opt),
               Error);
}

// MXFP4 weights (MLX's mode "mxfp4") through widen_mxfp4: random e2m1 nibbles, scale bytes in
// [lo, hi].
struct Mxfp4 {
  mx::array w{0}, scales{0};
};

Mxfp4 random_mxfp4(int N, int K, int lo, int hi, uint64_t seed) {
  return {
      mx::random::bits({N, K / 8}, 4, mx::random::key(seed)),
      mx::astype(mx::random::randint(lo, hi + 1, {N, K / 32}, mx::int32, mx::random::key(seed + 1)),
                 mx::uint8)};
}

// The widened weight dequantizes (MLX's 8-bit affine dequantize, float32) to the values of MLX's
// mxfp4 dequantize for every scale byte it takes, 0 (2^-127, a subnormal) to 251 (MLX's -0 for
// the nibble 8 becomes +0); its bytes hold 0..24.
TEST(QmmMxfp4, WidenedWeightDequantizesToMlxValues) {
  const int N = 256, K = 128;
  Mxfp4 m = random_mxfp4(N, K, 0, 251, 400);
  // Row n's first group takes the scale byte n % 252: every byte at least once.
  mx::array first = mx::astype(mx::remainder(mx::arange(N, mx::int32), mx::array(252)), mx::uint8);
  m.scales =
      mx::concatenate({mx::reshape(first, {N, 1}), mx::slice(m.scales, {0, 1}, {N, K / 32})}, 1);
  const auto a = kc::widen_mxfp4(m.w, m.scales);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->w.shape(), (mx::Shape{N, K / 4}));
  EXPECT_EQ(a->w.dtype(), mx::uint32);
  for (const mx::array* t : {&a->scales, &a->biases}) {
    EXPECT_EQ(t->shape(), m.scales.shape());
    EXPECT_EQ(t->dtype(), mx::bfloat16);
  }
  const mx::array want =
      mx::dequantize(m.w, m.scales, std::nullopt, 32, 4, "mxfp4", std::nullopt, mx::float32);
  const mx::array got =
      mx::dequantize(a->w, mx::astype(a->scales, mx::float32), mx::astype(a->biases, mx::float32),
                     32, 8, "affine", std::nullopt, mx::float32);
  EXPECT_TRUE(mx::array_equal(got, want).item<bool>());
  EXPECT_TRUE(
      mx::all(mx::less_equal(mx::view(a->w, mx::uint8), mx::array(24, mx::uint8))).item<bool>());
  // The 3-D (experts) shape widens the same, expert by expert.
  const mx::array w3 = mx::reshape(m.w, {4, N / 4, K / 8});
  const mx::array s3 = mx::reshape(m.scales, {4, N / 4, K / 32});
  const auto a3 = kc::widen_mxfp4(w3, s3);
  ASSERT_TRUE(a3.has_value());
  EXPECT_EQ(a3->w.shape(), (mx::Shape{4, N / 4, K / 4}));
  EXPECT_TRUE(mx::array_equal(mx::reshape(a3->w, {N, K / 4}), a->w).item<bool>());
  EXPECT_TRUE(mx::array_equal(mx::reshape(a3->biases, {N, K / 32}), a->biases).item<bool>());
}

// Scale bytes of 252 and up (2^125 and up; 255 is e8m0's NaN) leave the weight on MLX's ops; bad
// shapes and dtypes are errors.
TEST(QmmMxfp4, LargeScalesAreNotWidenedAndBadInputIsAnError) {
  const Mxfp4 m = random_mxfp4(8, 64, 100, 140, 410);
  for (int b : {252, 254, 255}) {
    const mx::array s =
        mx::concatenate({mx::full({1, 2}, b, mx::uint8), mx::slice(m.scales, {1, 0}, {8, 2})}, 0);
    EXPECT_FALSE(kc::widen_mxfp4(m.w, s).has_value()) << b;
  }
  EXPECT_TRUE(kc::widen_mxfp4(m.w, m.scales).has_value());
  EXPECT_THROW(kc::widen_mxfp4(m.w, mx::astype(m.scales, mx::float32)), Error);
  EXPECT_THROW(kc::widen_mxfp4(m.w, mx::slice(m.scales, {0, 0}, {8, 1})), Error);
  EXPECT_THROW(kc::widen_mxfp4(mx::flatten(m.w), mx::flatten(m.scales)), Error);
  EXPECT_THROW(kc::widen_mxfp4(mx::astype(m.w, mx::int32), m.scales), Error);
}

// Against mx::quantized_matmul(mode "mxfp4"): bit for bit on the float kernel of every ISA where
// the math is exact (integer x in [-4, 4], scales 2^-3 .. 2^3, K 256: every product and partial
// sum is a float32, so the summation order cannot matter); on the int8 path (normal x) within
// the int8 tests' RMS bound, and unlike the float kernel's result.
TEST(QmmMxfp4, MatchesMlxQuantizedMatmul) {
  const int N = 67, K = 256;
  const Mxfp4 m = random_mxfp4(N, K, 124, 130, 420);
  const auto a = kc::widen_mxfp4(m.w, m.scales);
  ASSERT_TRUE(a.has_value());
  uint64_t seed = 430;
  for (int M : {1, 3, 8, 17}) {
    const mx::array xi = mx::astype(
        mx::random::randint(-4, 5, {M, K}, mx::int32, mx::random::key(seed++)), mx::float32);
    const mx::array want =
        mx::quantized_matmul(xi, m.w, m.scales, std::nullopt, true, 32, 4, "mxfp4");
    auto run = [&](const mx::array& x, std::optional<kc::Isa> isa, kc::Int8Mode mode) {
      return kc::quantized_matmul(
          x, a->w, a->scales, a->biases,
          {.group_size = 32, .bits = 8, .isa = isa, .out_dtype = std::nullopt, .int8 = mode});
    };
    for (kc::Isa isa : isas()) {
      const mx::array got = run(xi, isa, kc::Int8Mode::off);
      ASSERT_EQ(got.dtype(), mx::float32);
      EXPECT_TRUE(mx::array_equal(got, want).item<bool>())
          << kc::isa_name(isa) << " M=" << M << ": max diff "
          << mx::max(mx::abs(mx::subtract(got, want))).item<float>();
    }
    if (int8_isas().empty()) continue;
    const mx::array x = mx::random::normal({M, K}, mx::float32, mx::random::key(seed++));
    const mx::array ref =
        mx::quantized_matmul(x, m.w, m.scales, std::nullopt, true, 32, 4, "mxfp4");
    const mx::array got = run(x, std::nullopt, kc::Int8Mode::all);
    EXPECT_FALSE(mx::array_equal(got, run(x, std::nullopt, kc::Int8Mode::off)).item<bool>());
    const float rms_err = std::sqrt(mx::mean(mx::square(mx::subtract(got, ref))).item<float>());
    const float rms = std::sqrt(mx::mean(mx::square(ref)).item<float>());
    EXPECT_LE(rms_err, rms / 8192) << "M=" << M;
  }
}

}  // namespace
}  // namespace lmx
