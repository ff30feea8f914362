// The L3 CUDA quantized matmul (kernels/cuda/qmv.cuh) on the GPU, on random inputs, for 4 and 8
// bits, groups 32/64/128, bfloat16 and float16, 1 to 16 rows (both token tiles) and several shapes:
// elementwise against the plain-MLX computation of what it promises (dequantize in float32, round
// each weight to the activation dtype, matmul in float32), and as a whole against MLX's own
// mx::quantized_matmul for single rows (decode; more rows would JIT-compile MLX's CUTLASS kernels,
// tens of seconds each). Compiled into CUDA builds only (tests/CMakeLists.txt).
#include <gtest/gtest.h>
#include <mlx/fast.h>
#include <mlx/primitives.h>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/qmm.h"

namespace lmx {
namespace {

namespace kc = kernels::cuda;
namespace mx = mlx::core;

struct Quantized {
  mx::array w{0}, scales{0}, biases{0};
};

Quantized quantize(int N, int K, int gs, int bits, mx::Dtype dtype, uint64_t seed) {
  mx::array wf = mx::astype(
      mx::random::normal({N, K}, mx::float32, 0.0f, 0.05f, mx::random::key(seed)), dtype);
  auto q = mx::quantize(wf, gs, bits);
  return {q[0], q[1], q[2]};
}

// max over elements of |got - want| / (|want| + 1e-2 * max|want|): against a reference with the
// kernel's own weight rounding, only the summation order and the output's rounding (2^-8 in
// bfloat16) remain; a wrong element (a misplaced input, group or row) is off by O(1).
double rel_error(const mx::array& got, const mx::array& want) {
  mx::array g = mx::astype(got, mx::float32), w = mx::astype(want, mx::float32);
  mx::array floor = mx::multiply(mx::max(mx::abs(w)), mx::array(1e-2f));
  return mx::max(mx::divide(mx::abs(mx::subtract(g, w)), mx::add(mx::abs(w), floor))).item<float>();
}

// ||got - want|| / ||want||: MLX's kernels keep the weights in float32 (its decode GEMV) or round
// them as lmx does (its tensor-core GEMM), so the two differ by bfloat16 operand rounding, which
// lands between 1e-3 and 1e-2.
double norm_error(const mx::array& got, const mx::array& want) {
  mx::array g = mx::astype(got, mx::float32), w = mx::astype(want, mx::float32);
  return mx::sqrt(mx::divide(mx::sum(mx::square(mx::subtract(g, w))), mx::sum(mx::square(w))))
      .item<float>();
}

// x @ dequantize(w).T in float32, each dequantized weight rounded to `dt` first.
mx::array reference(const mx::array& x, const Quantized& q, int gs, int bits, mx::Dtype dt) {
  mx::array wf = mx::dequantize(q.w, mx::astype(q.scales, mx::float32),
                                mx::astype(q.biases, mx::float32), gs, bits);
  wf = mx::astype(mx::astype(wf, dt), mx::float32);
  return mx::matmul(mx::astype(x, mx::float32), mx::transpose(wf));
}

using Layout = std::tuple<int, int, mx::Dtype>;  // bits, group size, activation/scale dtype

class CudaQmm : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kc::available()) << "a CUDA build must run on the GPU (LMX_BACKEND=cuda)";
  }
};

TEST_P(CudaQmm, MatchesMlxQuantizedMatmul) {
  const auto [bits, gs, dt] = GetParam();
  uint64_t seed = 7;
  // (N, K): one block of 16 features, a width past one wave of blocks, K of one 128-input slice
  // (fewer slices than warps) and of many (uneven over the 8 warps).
  const std::vector<std::pair<int, int>> shapes = {{16, 128}, {48, 1152}, {2576, 512}, {64, 3200}};
  for (auto [N, K] : shapes) {
    ASSERT_TRUE(kc::supports(bits, gs, "affine", dt, N, K));
    Quantized q = quantize(N, K, gs, bits, dt, seed++);
    for (int M : {1, 3, 8, 9, 16}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " K=" + std::to_string(K) +
                   " M=" + std::to_string(M));
      mx::array x =
          mx::astype(mx::random::normal({M, K}, mx::float32, mx::random::key(seed++)), dt);
      // The output starts as NaN: an element the kernel does not write stays NaN.
      mx::array got = kc::qmv(x, q.w, q.scales, q.biases, {.group_size = gs, .bits = bits},
                              std::numeric_limits<float>::quiet_NaN());
      mx::array want = reference(x, q, gs, bits, dt);
      ASSERT_EQ(got.shape(), (mx::Shape{M, N}));
      ASSERT_EQ(got.dtype(), dt);
      ASSERT_TRUE(mx::all(mx::isfinite(got)).item<bool>());
      EXPECT_LT(rel_error(got, want), 2.0 / 256);
      if (M == 1) {
        mx::array mlx = mx::quantized_matmul(x, q.w, q.scales, q.biases, true, gs, bits, "affine");
        ASSERT_EQ(mlx.dtype(), dt);
        EXPECT_LT(norm_error(got, mlx), 1e-2);
      }
    }
  }
}

std::string layout_name(const ::testing::TestParamInfo<Layout>& info) {
  const auto& [bits, gs, dt] = info.param;
  return "b" + std::to_string(bits) + "_g" + std::to_string(gs) + "_" +
         (dt == mx::bfloat16 ? "bf16" : "f16");
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaQmm,
                         ::testing::Combine(::testing::Values(4, 8), ::testing::Values(32, 64, 128),
                                            ::testing::Values(mx::bfloat16, mx::float16)),
                         layout_name);

// Leading dimensions, slices of kMaxRows rows up to kChunkedRows, the fallback past them and for
// float32 activations (MLX's op), and the refusal of a layout the kernel lacks.
TEST(CudaQmmApi, ShapesFallbackAndErrors) {
  ASSERT_TRUE(kc::available());
  Quantized q = quantize(32, 256, 64, 4, mx::bfloat16, 3);
  const kc::QmmOptions opt{.group_size = 64, .bits = 4};
  mx::array x3 =
      mx::astype(mx::random::normal({2, 3, 256}, mx::float32, mx::random::key(4)), mx::bfloat16);
  ASSERT_TRUE(kc::takes_kernel(x3, q.w, q.scales, opt));
  mx::array got = kc::quantized_matmul(x3, q.w, q.scales, q.biases, opt);
  mx::array want =
      mx::reshape(reference(mx::reshape(x3, {6, 256}), q, 64, 4, mx::bfloat16), {2, 3, 32});
  ASSERT_EQ(got.shape(), (mx::Shape{2, 3, 32}));
  EXPECT_LT(rel_error(got, want), 2.0 / 256);

  // 17 to kChunkedRows rows (a batched decode step): the kernel kMaxRows rows at a time.
  for (int M : {17, 40, kc::kChunkedRows}) {
    mx::array xm =
        mx::astype(mx::random::normal({M, 256}, mx::float32, mx::random::key(5 + M)), mx::bfloat16);
    EXPECT_FALSE(kc::takes_kernel(xm, q.w, q.scales, opt));
    mx::array ym = kc::quantized_matmul(xm, q.w, q.scales, q.biases, opt);
    ASSERT_EQ(ym.shape(), (mx::Shape{M, 32}));
    EXPECT_LT(rel_error(ym, reference(xm, q, 64, 4, mx::bfloat16)), 2.0 / 256) << M << " rows";
  }
  // More rows: MLX's op itself (not evaluated: its kernel for them is a long JIT compile).
  const int past = kc::kChunkedRows + 1;
  mx::array xp =
      mx::astype(mx::random::normal({past, 256}, mx::float32, mx::random::key(5)), mx::bfloat16);
  mx::array yp = kc::quantized_matmul(xp, q.w, q.scales, q.biases, opt);
  ASSERT_EQ(yp.shape(), (mx::Shape{past, 32}));
  EXPECT_EQ(yp.primitive().name(), std::string("QuantizedMatmul"));

  mx::array xf = mx::random::normal({1, 256}, mx::float32, mx::random::key(6));
  EXPECT_FALSE(kc::takes_kernel(xf, q.w, q.scales, opt));
  EXPECT_THROW(kc::qmv(xf, q.w, q.scales, q.biases, opt), Error);

  EXPECT_FALSE(kc::supports(3, 64, "affine", mx::bfloat16, 32, 256));
  EXPECT_FALSE(kc::supports(4, 64, "affine", mx::bfloat16, 24, 256));
  EXPECT_FALSE(kc::supports(4, 64, "affine", mx::bfloat16, 32, 192));
  EXPECT_FALSE(kc::supports(4, 64, "mxfp4", mx::bfloat16, 32, 256));
  EXPECT_FALSE(kc::supports(4, 64, "affine", mx::float32, 32, 256));
}

// Inputs that are views, not row-contiguous, when the kernel runs: the primitive copies them
// densely first (the fat binary's copy kernels, 2-byte for x / scales / biases, 4-byte for w).
TEST(CudaQmmApi, StridedInputs) {
  ASSERT_TRUE(kc::available());
  const int N = 48, K = 512, gs = 64, bits = 4;
  const kc::QmmOptions opt{.group_size = gs, .bits = bits};
  Quantized q = quantize(N, K, gs, bits, mx::bfloat16, 11);
  // Each of w, scales, biases as the left half of a wider array: row stride twice the width.
  auto left = [](const mx::array& a) { return mx::slice(a, {0, 0}, {a.shape(0), a.shape(1) / 2}); };
  Quantized views = q;
  views.w = left(mx::concatenate({q.w, q.w}, 1));
  views.scales = left(mx::concatenate({q.scales, q.scales}, 1));
  views.biases = left(mx::concatenate({q.biases, q.biases}, 1));
  for (int M : {1, 5, 12}) {
    SCOPED_TRACE("M=" + std::to_string(M));
    // x (M, K) as the transpose of a (K, M) array.
    mx::array xt =
        mx::astype(mx::random::normal({K, M}, mx::float32, mx::random::key(20 + M)), mx::bfloat16);
    mx::array x = mx::transpose(xt);
    mx::eval(x, views.w, views.scales, views.biases);
    if (M > 1) {
      ASSERT_FALSE(x.flags().row_contiguous);
    }
    ASSERT_FALSE(views.w.flags().row_contiguous);
    ASSERT_FALSE(views.scales.flags().row_contiguous);
    mx::array got = kc::qmv(x, views.w, views.scales, views.biases, opt,
                            std::numeric_limits<float>::quiet_NaN());
    mx::array want = reference(mx::contiguous(x), q, gs, bits, mx::bfloat16);
    ASSERT_EQ(got.shape(), (mx::Shape{M, N}));
    ASSERT_TRUE(mx::all(mx::isfinite(got)).item<bool>());
    EXPECT_LT(rel_error(got, want), 2.0 / 256);
  }
}

// The fused calls (kernels/cuda/qmm.h): q/k/v of one x in one launch, bit for bit each own qmv;
// the residual add in the kernel, bit for bit mx::add of qmv's output; gate and up with
// silu(g) * u, against the float32 reference and against MLX's ops over two qmv calls.
class CudaQmmFused : public CudaQmm {};

TEST_P(CudaQmmFused, MatchOneCallAtATime) {
  const auto [bits, gs, dt] = GetParam();
  const kc::QmmOptions opt{.group_size = gs, .bits = bits};
  const int K = 640;
  uint64_t seed = 100;
  Quantized q = quantize(64, K, gs, bits, dt, seed++), k = quantize(32, K, gs, bits, dt, seed++),
            v = quantize(48, K, gs, bits, dt, seed++);
  Quantized gate = quantize(96, K, gs, bits, dt, seed++),
            up = quantize(96, K, gs, bits, dt, seed++);
  auto mat = [](const Quantized& a) { return kc::QMatrix{a.w, a.scales, a.biases}; };
  auto one = [&](const mx::array& x, const Quantized& a) {
    return kc::qmv(x, a.w, a.scales, a.biases, opt);
  };
  for (int M : {1, 5, 9, 16}) {
    SCOPED_TRACE("M=" + std::to_string(M));
    mx::array x =
        mx::astype(mx::random::normal({1, M, K}, mx::float32, mx::random::key(seed++)), dt);
    ASSERT_TRUE(kc::takes_fused(x, {mat(q), mat(k), mat(v)}, opt));
    std::vector<mx::array> qkv = kc::qmv_multi(x, {mat(q), mat(k), mat(v)}, opt);
    ASSERT_EQ(qkv.size(), 3u);
    ASSERT_EQ(qkv[0].primitive().name(), std::string("LmxCudaQmvFused"));
    const Quantized* parts[3] = {&q, &k, &v};
    for (int i = 0; i < 3; ++i) {
      mx::array want = one(x, *parts[i]);
      ASSERT_EQ(qkv[i].shape(), want.shape());
      EXPECT_TRUE(mx::array_equal(qkv[i], want).item<bool>()) << "output " << i;
    }

    mx::array res = mx::astype(
        mx::random::normal({1, M, 64}, mx::float32, 0.0f, 4.0f, mx::random::key(seed++)), dt);
    mx::array added = kc::qmv_add(x, mat(q), res, opt);
    EXPECT_TRUE(mx::array_equal(added, mx::add(res, one(x, q))).item<bool>());

    mx::array got = kc::qmv_swiglu(x, mat(gate), mat(up), opt);
    ASSERT_EQ(got.shape(), (mx::Shape{1, M, 96}));
    ASSERT_TRUE(mx::all(mx::isfinite(got)).item<bool>());
    mx::array x2 = mx::reshape(x, {M, K});
    mx::array g = reference(x2, gate, gs, bits, dt), u = reference(x2, up, gs, bits, dt);
    mx::array want = mx::multiply(mx::multiply(g, mx::sigmoid(g)), u);
    EXPECT_LT(rel_error(mx::reshape(got, {M, 96}), want), 4.0 / 256);
    mx::array g1 = one(x, gate), u1 = one(x, up);
    EXPECT_LT(norm_error(got, mx::multiply(mx::multiply(g1, mx::sigmoid(g1)), u1)), 1e-2);

    // An RMSNorm folded in (kc::FusedNorm): the products of norm(x), its roundings moved.
    mx::array nw =
        mx::astype(mx::random::normal({K}, mx::float32, 1.0f, 0.2f, mx::random::key(seed++)), dt);
    const float eps = 1e-5f;
    mx::array xs = mx::multiply(x, mx::array(3.0f, dt));  // rms 3: the scale must come out
    mx::array xn = mx::fast::rms_norm(xs, nw, eps);
    std::vector<mx::array> qkn =
        kc::qmv_multi(xs, {mat(q), mat(k), mat(v)}, opt, kc::FusedNorm{nw, eps});
    for (int i = 0; i < 3; ++i)
      EXPECT_LT(norm_error(qkn[i], one(xn, *parts[i])), 1e-2) << "normed output " << i;
    mx::array gn = one(xn, gate), un = one(xn, up);
    EXPECT_LT(norm_error(kc::qmv_swiglu(xs, mat(gate), mat(up), opt, kc::FusedNorm{nw, eps}),
                         mx::multiply(mx::multiply(gn, mx::sigmoid(gn)), un)),
              2e-2);
  }
  EXPECT_THROW(kc::qmv_multi(mx::zeros({1, K}, dt), {mat(q)}, opt,
                             kc::FusedNorm{mx::ones({K + 1}, dt), 1e-5f}),
               Error);
  // Not taken: more than kMaxRows rows, a weight of another K; refused with a named error.
  mx::array x17 = mx::astype(mx::random::normal({17, K}, mx::float32, mx::random::key(1)), dt);
  EXPECT_FALSE(kc::takes_fused(x17, {mat(q)}, opt));
  EXPECT_THROW(kc::qmv_multi(x17, {mat(q)}, opt), Error);
  mx::array x1 = mx::astype(mx::random::normal({1, K}, mx::float32, mx::random::key(2)), dt);
  Quantized other = quantize(32, K + 128, gs, bits, dt, 9);
  EXPECT_FALSE(kc::takes_fused(x1, {mat(q), mat(other)}, opt));
  EXPECT_THROW(kc::qmv_multi(x1, {mat(q), mat(other)}, opt), Error);
  EXPECT_THROW(kc::qmv_swiglu(x1, mat(q), mat(k), opt), Error);  // 64 vs 32 outputs
  EXPECT_THROW(kc::qmv_add(x1, mat(q), mx::zeros({1, 32}, dt), opt), Error);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaQmmFused,
                         ::testing::Combine(::testing::Values(4, 8), ::testing::Values(64, 128),
                                            ::testing::Values(mx::bfloat16, mx::float16)),
                         layout_name);

// A decode step's per-head q/k norms and RoPE in one kernel (kc::qk_norm_rope) against MLX's ops
// on the GPU (mx::fast::rms_norm per head, the transpose, mx::fast::rope): the same roundings
// with the sum of squares added in another order, so elements agree exactly or within an ulp or
// two of the output dtype.
TEST(CudaQkRope, MatchesTheNormsAndRope) {
  if (!kc::available()) GTEST_SKIP() << "needs the GPU of a CUDA build";
  const int Hq = 4, Hk = 2, offset = 37;
  uint64_t seed = 500;
  for (mx::Dtype dt : {mx::bfloat16, mx::float16})
    for (int D : {64, 128, 256})
      for (bool norm : {true, false})
        for (bool with_freqs : {false, true})
          for (auto [B, L] : {std::pair{1, 1}, std::pair{2, 3}}) {
            SCOPED_TRACE(std::string(dt == mx::float16 ? "f16" : "bf16") +
                         " D=" + std::to_string(D) + " norm=" + std::to_string(norm) +
                         " freqs=" + std::to_string(with_freqs) + " B=" + std::to_string(B) +
                         " L=" + std::to_string(L));
            auto normal = [&](mx::Shape shape, float mean, float sd) {
              return mx::astype(
                  mx::random::normal(shape, mx::float32, mean, sd, mx::random::key(seed++)), dt);
            };
            mx::array q = normal({B, L, Hq * D}, 0.0f, 2.0f),
                      k = normal({B, L, Hk * D}, 0.0f, 2.0f);
            std::optional<mx::array> qw, kw, freqs;
            if (norm) {
              qw = normal({D}, 1.0f, 0.3f);
              kw = normal({D}, 1.0f, 0.3f);
            }
            // llama3-style frequencies: base^(2i / D), some stretched.
            if (with_freqs)
              freqs = mx::multiply(
                  mx::power(mx::array(500000.0f),
                            mx::divide(mx::arange(0, D, 2, mx::float32), mx::array(float(D)))),
                  mx::where(mx::greater(mx::arange(D / 2), mx::array(D / 4)), mx::array(8.0f),
                            mx::array(1.0f)));
            const float base = 1000000.0f, scale = with_freqs ? 1.0f : 0.5f, eps = 1e-6f;
            const kc::QkRopeOptions o{.n_heads = Hq,
                                      .n_kv_heads = Hk,
                                      .head_dim = D,
                                      .eps = eps,
                                      .base = base,
                                      .scale = scale,
                                      .offset = offset};
            ASSERT_TRUE(kc::takes_qk_norm_rope(q, k, o));
            auto got = kc::qk_norm_rope(q, k, qw, kw, freqs, o);
            ASSERT_EQ(got.size(), 2u);
            ASSERT_EQ(got[0].primitive().name(), std::string("LmxCudaQkRope"));
            auto want = [&](const mx::array& x, int H, const std::optional<mx::array>& w) {
              mx::array t = mx::reshape(x, {B, L, H, D});
              if (w) t = mx::fast::rms_norm(t, *w, eps);
              t = mx::transpose(t, {0, 2, 1, 3});
              return mx::fast::rope(t, D, false, with_freqs ? std::nullopt : std::optional(base),
                                    scale, offset, freqs);
            };
            const mx::array wq = want(q, Hq, qw), wk = want(k, Hk, kw);
            ASSERT_EQ(got[0].shape(), wq.shape());
            ASSERT_EQ(got[1].shape(), wk.shape());
            for (auto [g, w] : {std::pair{got[0], wq}, std::pair{got[1], wk}}) {
              ASSERT_TRUE(mx::all(mx::isfinite(g)).item<bool>());
              // Within two ulps of the output dtype (relative 2^-7 / 2^-10 of the element, with a
              // floor for elements near zero after the rotation).
              EXPECT_LT(rel_error(g, w), dt == mx::bfloat16 ? 2.0 / 128 : 2.0 / 1024);
              const float same = mx::mean(mx::astype(mx::equal(g, w), mx::float32)).item<float>();
              EXPECT_GE(same, 0.9f) << "elements bit-identical to MLX's ops";
            }
          }
  // Refused with a named error: more than kMaxRows positions, head_dim 96.
  mx::array q17 = mx::zeros({1, 17, 4 * 64}, mx::bfloat16),
            k17 = mx::zeros({1, 17, 2 * 64}, mx::bfloat16);
  const kc::QkRopeOptions o64{.n_heads = 4, .n_kv_heads = 2, .head_dim = 64};
  EXPECT_FALSE(kc::takes_qk_norm_rope(q17, k17, o64));
  EXPECT_THROW(kc::qk_norm_rope(q17, k17, std::nullopt, std::nullopt, std::nullopt, o64), Error);
  mx::array q96 = mx::zeros({1, 1, 4 * 96}, mx::bfloat16),
            k96 = mx::zeros({1, 1, 2 * 96}, mx::bfloat16);
  const kc::QkRopeOptions o96{.n_heads = 4, .n_kv_heads = 2, .head_dim = 96};
  EXPECT_FALSE(kc::takes_qk_norm_rope(q96, k96, o96));
}

}  // namespace
}  // namespace lmx
