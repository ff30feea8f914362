// The L3 MoE expert matmul (kernels/cpu/gather_qmm.h) against MLX's gather_qmm on random
// inputs: decode (1 token, top-k experts), a few tokens, and 64 (token, expert) pairs sorted by
// expert (SwitchGLU's sorted path) and unsorted; float32 and int8 kernel paths.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/gather_qmm.h"

namespace lmx {
namespace {

namespace kc = kernels::cpu;
namespace mx = mlx::core;

constexpr int kExperts = 8;

kc::QmmOptions options(int gs, int bits, std::optional<kc::Int8Mode> int8 = std::nullopt) {
  kc::QmmOptions o;
  o.group_size = gs;
  o.bits = bits;
  o.int8 = int8;
  return o;
}

struct Experts {
  mx::array w{0}, scales{0}, biases{0};
};

Experts quantize_experts(int N, int K, int gs, int bits, mx::Dtype sdt, uint64_t seed) {
  mx::array wf = mx::astype(
      mx::random::normal({kExperts, N, K}, mx::float32, 0.0f, 0.05f, mx::random::key(seed)), sdt);
  auto q = mx::quantize(wf, gs, bits);
  mx::eval(q);
  return {q[0], q[1], q[2]};
}

// A call as SwitchLinear makes it: x and indices shaped as SwitchGLU passes them.
struct Call {
  std::string name;
  mx::array x{0}, indices{0};
};

std::vector<Call> calls(int K, uint64_t seed) {
  auto normal = [&](mx::Shape s) {
    return mx::random::normal(std::move(s), mx::float32, mx::random::key(seed++));
  };
  auto ids = [&](mx::Shape s) {
    return mx::astype(
        mx::random::randint(0, kExperts, std::move(s), mx::int32, mx::random::key(seed++)),
        mx::uint32);
  };
  // Top-k distinct experts per token, as the router gives them.
  auto topk = [&](int tokens, int k) {
    mx::array scores =
        mx::random::normal({1, tokens, kExperts}, mx::float32, mx::random::key(seed++));
    mx::Shape lo{0, 0, kExperts - k}, hi{1, tokens, kExperts};
    return mx::astype(mx::slice(mx::argpartition(scores, -k, -1), lo, hi), mx::uint32);
  };
  mx::array sorted = mx::sort(ids({64}));
  return {
      {"decode (1 token, 4 experts, broadcast x)", normal({1, 1, 1, 1, K}), topk(1, 4)},
      {"decode down_proj (1 token, 4 experts)", normal({1, 1, 4, 1, K}), topk(1, 4)},
      {"4 tokens x 2 experts", normal({1, 4, 1, 1, K}), topk(4, 2)},
      {"64 pairs sorted", normal({64, 1, K}), sorted},
      {"64 pairs unsorted", normal({1, 32, 1, 1, K}), topk(32, 2)},
      {"64 pairs, one expert", normal({64, 1, K}), mx::full({64}, 5u)},
  };
}

double error_to_largest(const mx::array& got, const mx::array& want) {
  mx::array g = mx::astype(got, mx::float32);
  return mx::divide(mx::max(mx::abs(mx::subtract(g, want))), mx::max(mx::abs(want))).item<float>();
}

double rms_ratio(const mx::array& got, const mx::array& want) {
  mx::array d = mx::subtract(mx::astype(got, mx::float32), want);
  return std::sqrt(mx::mean(mx::square(d)).item<float>() /
                   mx::mean(mx::square(want)).item<float>());
}

using Layout = std::tuple<int, int, mx::Dtype>;  // bits, group size, scale dtype

class GatherQmmLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(GatherQmmLayouts, MatchesMlxGatherQmm) {
  const auto [bits, gs, sdt] = GetParam();
  const int N = 40, K = 256;
  Experts q = quantize_experts(N, K, gs, bits, sdt, 7 + bits + gs);
  // The float32 reference: MLX's gather_qmm on float32 x and scales (the same values), which
  // accumulates in float32 (with bfloat16 it accumulates in bfloat16).
  const mx::array s32 = mx::astype(q.scales, mx::float32), b32 = mx::astype(q.biases, mx::float32);
  const bool packing = kc::packing();
  for (const Call& c : calls(K, 100 + bits)) {
    const bool sorted =
        c.name.find("sorted") != std::string::npos && c.name.find("unsorted") == std::string::npos;
    for (mx::Dtype xdt : {mx::float32, mx::bfloat16}) {
      const mx::array x = mx::astype(c.x, xdt);
      const mx::array want =
          mx::gather_qmm(mx::astype(x, mx::float32), q.w, s32, b32, std::nullopt, c.indices, true,
                         gs, bits, "affine", std::nullopt, sorted);
      const mx::array stock = mx::gather_qmm(x, q.w, q.scales, q.biases, std::nullopt, c.indices,
                                             true, gs, bits, "affine", std::nullopt, sorted);
      for (kc::Int8Mode m : {kc::Int8Mode::off, kc::Int8Mode::best, kc::Int8Mode::all}) {
        for (bool pack : {false, true}) {
          kc::set_packing(pack);
          std::ostringstream where;
          where << c.name << " x " << xdt << " int8 " << static_cast<int>(m) << " pack " << pack;
          const mx::array got = kc::gather_quantized_matmul(x, q.w, q.scales, q.biases, c.indices,
                                                            options(gs, bits, m));
          ASSERT_EQ(got.shape(), want.shape()) << where.str();
          ASSERT_EQ(got.dtype(), stock.dtype()) << where.str();
          if (m == kc::Int8Mode::off) {
            // The float kernel: float32 accumulation in another order (test_qmm.cpp's bounds),
            // then the bfloat16 output's rounding.
            EXPECT_LE(error_to_largest(got, want), xdt == mx::float32 ? 2e-6 : 1.0 / 256)
                << where.str();
          } else {
            // The int8 path where it applies (test_qmm.cpp's RMS bound, 2^-13 of the output's
            // RMS; bfloat16 output rounding on top for bf16 x).
            EXPECT_LE(rms_ratio(got, want), xdt == mx::float32 ? 1.0 / 8192 : 1.0 / 256)
                << where.str();
          }
          if (m == kc::Int8Mode::all && bits <= kc::int8_max_bits(kc::active_isa())) {
            const mx::array off = kc::gather_quantized_matmul(x, q.w, q.scales, q.biases, c.indices,
                                                              options(gs, bits, kc::Int8Mode::off));
            EXPECT_FALSE(mx::array_equal(got, off).item<bool>())
                << where.str() << ": the int8 path must differ from the float one (it ran)";
          }
          // Each expert's rows equal the Linear kernel's call on the same rows, bit for bit.
          const int M = c.x.shape(-2);
          const mx::Shape batch(want.shape().begin(), want.shape().end() - 2);
          const mx::array idx = mx::flatten(mx::broadcast_to(c.indices, batch));
          mx::Shape xs = batch;
          xs.insert(xs.end(), {M, K});
          const mx::array xf = mx::reshape(mx::broadcast_to(x, xs), {-1, M, K});
          const mx::array gf = mx::reshape(got, {-1, M, N});
          std::vector<uint32_t> ids(idx.size());
          mx::array idx32 = mx::astype(idx, mx::uint32);
          mx::eval(idx32);
          std::copy(idx32.data<uint32_t>(), idx32.data<uint32_t>() + ids.size(), ids.begin());
          for (uint32_t e = 0; e < kExperts; ++e) {
            std::vector<int32_t> rows;
            for (size_t b = 0; b < ids.size(); ++b)
              if (ids[b] == e) rows.push_back(static_cast<int32_t>(b));
            if (rows.empty()) continue;
            const mx::array r(rows.data(), {static_cast<int>(rows.size())}, mx::int32);
            auto expert = [&](const mx::array& a) {
              return mx::squeeze(mx::slice(a, {static_cast<int>(e), 0, 0},
                                           {static_cast<int>(e) + 1, a.shape(1), a.shape(2)}),
                                 0);
            };
            const mx::array one =
                kc::quantized_matmul(mx::reshape(mx::take(xf, r, 0), {-1, K}),
                                     mx::contiguous(expert(q.w)), mx::contiguous(expert(q.scales)),
                                     mx::contiguous(expert(q.biases)), options(gs, bits, m));
            EXPECT_TRUE(mx::array_equal(mx::reshape(mx::take(gf, r, 0), {-1, N}), one).item<bool>())
                << where.str() << " expert " << e;
          }
        }
      }
    }
  }
  kc::set_packing(packing);
}

std::string layout_name(const ::testing::TestParamInfo<Layout>& p) {
  const auto [bits, gs, sdt] = p.param;
  const char* s = sdt == mx::float32 ? "f32" : sdt == mx::bfloat16 ? "bf16" : "f16";
  return "b" + std::to_string(bits) + "_g" + std::to_string(gs) + "_" + s;
}

INSTANTIATE_TEST_SUITE_P(All, GatherQmmLayouts,
                         ::testing::Combine(::testing::Values(4, 8), ::testing::Values(32, 64, 128),
                                            ::testing::Values(mx::float32, mx::bfloat16)),
                         layout_name);

TEST(GatherQmm, RepeatableAndOtherWidthsRun) {
  // 3- and 6-bit experts on the float kernel (6-bit: LMX_CPU_WIDEN's off state); repeated calls
  // are bit-identical.
  const bool widening = kc::widening();
  kc::set_widening(false);
  for (int bits : {3, 6}) {
    Experts q = quantize_experts(24, 128, 64, bits, mx::float32, 40 + bits);
    for (const Call& c : calls(128, 50)) {
      auto run = [&] {
        return kc::gather_quantized_matmul(c.x, q.w, q.scales, q.biases, c.indices,
                                           options(64, bits));
      };
      const mx::array want =
          mx::gather_qmm(c.x, q.w, q.scales, q.biases, std::nullopt, c.indices, true, 64, bits);
      EXPECT_LE(error_to_largest(run(), want), 2e-6) << c.name << " bits " << bits;
      EXPECT_TRUE(mx::array_equal(run(), run()).item<bool>()) << c.name;
    }
  }
  kc::set_widening(widening);
}

// 5- and 6-bit experts on the int8 path through their byte-wide copies: the result of the same
// integers as 8-bit experts, within the int8 path's RMS bound of mx::gather_qmm, unlike the
// float kernel's (LMX_CPU_WIDEN off).
TEST(GatherQmm, FiveAndSixBitExpertsTakeTheWidenedInt8Path) {
  if (kc::int8_max_bits(kc::active_isa()) < 8)
    GTEST_SKIP() << "this CPU has no int8 kernel for 8-bit weights";
  for (int bits : {5, 6}) {
    Experts q = quantize_experts(24, 128, 64, bits, mx::float32, 60 + bits);
    const mx::array w8 = mx::view(
        mx::astype(mx::dequantize(q.w, mx::ones_like(q.scales), mx::zeros_like(q.biases), 64, bits),
                   mx::uint8),
        mx::uint32);
    for (const Call& c : calls(128, 70)) {
      auto run = [&](const mx::array& w, int b) {
        return kc::gather_quantized_matmul(c.x, w, q.scales, q.biases, c.indices,
                                           options(64, b, kc::Int8Mode::all));
      };
      const mx::array got = run(q.w, bits);
      const mx::array want =
          mx::gather_qmm(c.x, q.w, q.scales, q.biases, std::nullopt, c.indices, true, 64, bits);
      EXPECT_TRUE(mx::array_equal(got, run(w8, 8)).item<bool>()) << c.name << " bits " << bits;
      EXPECT_LE(rms_ratio(got, want), 1.0 / 8192) << c.name << " bits " << bits;
      kc::set_widening(false);
      EXPECT_FALSE(mx::array_equal(got, run(q.w, bits)).item<bool>()) << c.name;
      kc::set_widening(true);
    }
  }
}

// MXFP4 experts (mode "mxfp4") through their 8-bit affine copies (widen_mxfp4), K 128 and
// gpt-oss's 2880 (90 groups): bit for bit against mx::gather_qmm on the float kernel where the
// math is exact (integer x in [-4, 4], scales 2^-3 .. 2^3: every product and partial sum, at
// most 2880 x 6 x 8 x 4 < 2^20 in steps of 2^-4, is a float32), in x's dtype as MLX's; on the
// int8 path (normal x) within the RMS bound above and unlike the float kernel's result.
TEST(GatherQmm, Mxfp4ExpertsMatchMlxGatherQmm) {
  const int N = 24;
  for (int K : {128, 2880}) {
    const mx::array w = mx::random::bits({kExperts, N, K / 8}, 4, mx::random::key(80));
    const mx::array scales = mx::astype(
        mx::random::randint(124, 131, {kExperts, N, K / 32}, mx::int32, mx::random::key(81)),
        mx::uint8);
    const auto a = kc::widen_mxfp4(w, scales);
    ASSERT_TRUE(a.has_value());
    for (const Call& c : calls(K, 90)) {
      const std::string where = c.name + ", K " + std::to_string(K);
      auto run = [&](const mx::array& x, kc::Int8Mode mode) {
        kc::QmmOptions o = options(32, 8, mode);
        o.out_dtype = x.dtype();
        return kc::gather_quantized_matmul(x, a->w, a->scales, a->biases, c.indices, o);
      };
      auto mlx = [&](const mx::array& x) {
        return mx::gather_qmm(x, w, scales, std::nullopt, std::nullopt, c.indices, true, 32, 4,
                              "mxfp4");
      };
      const mx::array xi = mx::clip(mx::round(mx::multiply(c.x, mx::array(2.0f))), mx::array(-4.0f),
                                    mx::array(4.0f));
      const mx::array got = run(xi, kc::Int8Mode::off), want = mlx(xi);
      ASSERT_EQ(got.shape(), want.shape()) << where;
      EXPECT_TRUE(mx::array_equal(got, want).item<bool>())
          << where << ": max diff " << mx::max(mx::abs(mx::subtract(got, want))).item<float>();
      const mx::array xb = mx::astype(xi, mx::bfloat16);
      EXPECT_EQ(run(xb, kc::Int8Mode::off).dtype(), mlx(xb).dtype()) << where;
      if (kc::int8_max_bits(kc::active_isa()) < 8) continue;
      const mx::array got8 = run(c.x, kc::Int8Mode::all);
      EXPECT_LE(rms_ratio(got8, mlx(c.x)), 1.0 / 8192) << where;
      EXPECT_FALSE(mx::array_equal(got8, run(c.x, kc::Int8Mode::off)).item<bool>()) << where;
    }
  }
}

TEST(GatherQmm, ExpertIdsOutsideTheWeightGiveZeros) {
  Experts q = quantize_experts(16, 128, 64, 4, mx::float32, 5);
  const mx::array x = mx::random::normal({3, 1, 128}, mx::float32, mx::random::key(6));
  const mx::array got = kc::gather_quantized_matmul(
      x, q.w, q.scales, q.biases, mx::array({2, kExperts, -1}), options(64, 4, kc::Int8Mode::off));
  const mx::array want = mx::gather_qmm(mx::slice(x, {0, 0, 0}, {1, 1, 128}), q.w, q.scales,
                                        q.biases, std::nullopt, mx::array({2u}), true, 64, 4);
  EXPECT_LE(error_to_largest(mx::slice(got, {0, 0, 0}, {1, 1, 16}), want), 2e-6);
  EXPECT_TRUE(
      mx::all(mx::equal(mx::slice(got, {1, 0, 0}, {3, 1, 16}), mx::array(0.0f))).item<bool>());
}

TEST(GatherQmm, BadInputIsAnError) {
  Experts q = quantize_experts(16, 128, 64, 4, mx::float32, 3);
  const mx::array x = mx::zeros({2, 1, 128});
  const mx::array idx = mx::array({0u, 1u});
  const kc::QmmOptions opt = options(64, 4);
  EXPECT_THROW(kc::gather_quantized_matmul(x, q.w, q.scales, q.biases, mx::zeros({2}), opt),
               Error);  // float indices
  EXPECT_THROW(
      kc::gather_quantized_matmul(mx::zeros({2, 1, 96}), q.w, q.scales, q.biases, idx, opt),
      Error);  // K of another weight
  EXPECT_THROW(
      kc::gather_quantized_matmul(x, mx::squeeze(mx::slice(q.w, {0, 0, 0}, {1, 16, 16}), 0),
                                  q.scales, q.biases, idx, opt),
      Error);  // a 2-D weight
  EXPECT_THROW(
      kc::gather_quantized_matmul(x, q.w, q.scales, q.biases, mx::array({0u, 1u, 2u}), opt),
      std::exception);  // indices that do not broadcast with x's batch
  EXPECT_THROW(kc::gather_quantized_matmul(x, q.w, q.scales, q.biases, idx, options(64, 7)), Error);
}

}  // namespace
}  // namespace lmx
