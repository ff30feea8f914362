// lmx's CUDA rows decode attention (kernels/cuda/rows_attention.h) against the per-row MLX ops it
// replaces (the new key/value written into each row's buffer with slice_update, then softmax(q K^T
// * scale) V in float32 over the row's positions), on random inputs: several row counts (one and
// two launches), lengths (one split and several), GQA ratios, head dims and dtypes, the output
// poisoned with NaN first. Compiled into every build; without a CUDA build running on a GPU (CI)
// the kernel tests skip, saying so.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/qmm.h"
#include "kernels/cuda/rows_attention.h"

namespace lmx {
namespace {

namespace mx = mlx::core;

#define LMX_NEEDS_GPU()                                                                      \
  if (!kernels::cuda::available())                                                           \
  GTEST_SKIP() << "needs a CUDA build running on a GPU (lmx's CUDA rows attention kernel); " \
                  "this build or machine has none"

mx::array random_array(const mx::Shape& shape, mx::Dtype dtype, uint64_t seed) {
  return mx::astype(mx::random::normal(shape, mx::float32, 0.0f, 1.0f, mx::random::key(seed)),
                    dtype);
}

struct Case {
  mx::Dtype dtype;
  int D, Hq, Hkv;
  std::vector<int> offsets, caps;
  std::vector<bool> in_place;
  double tol;  // ||out - ref|| / ||ref||
};

std::string describe(const Case& c) {
  std::string s = std::string(c.dtype == mx::bfloat16  ? "bf16"
                              : c.dtype == mx::float16 ? "f16"
                                                       : "f32") +
                  " D=" + std::to_string(c.D) + " Hq=" + std::to_string(c.Hq) +
                  " Hkv=" + std::to_string(c.Hkv) + " B=" + std::to_string(c.offsets.size());
  return s;
}

// Row b's buffer, the same values twice from one seed: one goes to the kernel, the twin stays.
mx::array buffer(const Case& c, int b, int which, uint64_t seed) {
  return random_array({1, c.Hkv, c.caps[b], c.D}, c.dtype, seed * 1000 + b * 2 + which);
}

void run_case(const Case& c, uint64_t seed) {
  const int B = static_cast<int>(c.offsets.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  mx::array q = random_array({B, c.Hq, 1, c.D}, c.dtype, seed + 1);
  mx::array k = random_array({B, c.Hkv, 1, c.D}, c.dtype, seed + 2);
  mx::array v = random_array({B, c.Hkv, 1, c.D}, c.dtype, seed + 3);
  std::vector<mx::array> keys, values;
  for (int b = 0; b < B; ++b) {
    keys.push_back(buffer(c, b, 0, seed));
    values.push_back(buffer(c, b, 1, seed));
  }
  mx::eval(q, k, v);
  mx::eval(keys);
  mx::eval(values);
  auto out = kernels::cuda::rows_decode_attention(q, k, v, keys, values, c.offsets, c.in_place,
                                                  scale, /*prefill=*/NAN);
  mx::eval(out);

  const int G = c.Hq / c.Hkv;
  for (int b = 0; b < B; ++b) {
    SCOPED_TRACE(describe(c) + " row " + std::to_string(b) + " offset " +
                 std::to_string(c.offsets[b]));
    const int off = c.offsets[b], len = off + 1;
    auto row = [&](const mx::array& x) {
      mx::Shape start(x.ndim(), 0), stop = x.shape();
      start[0] = b;
      stop[0] = b + 1;
      return mx::slice(x, start, stop);
    };
    // The buffers: the twin with the new position written.
    const mx::Shape at{0, 0, off, 0}, to{1, c.Hkv, len, c.D};
    mx::array want_k = mx::slice_update(buffer(c, b, 0, seed), row(k), at, to);
    mx::array want_v = mx::slice_update(buffer(c, b, 1, seed), row(v), at, to);
    EXPECT_TRUE(mx::array_equal(out[1 + 2 * b], want_k).item<bool>());
    EXPECT_TRUE(mx::array_equal(out[2 + 2 * b], want_v).item<bool>());
    if (c.in_place[b]) {
      EXPECT_EQ(out[1 + 2 * b].buffer().ptr(), keys[b].buffer().ptr()) << "not written in place";
    } else {
      EXPECT_NE(out[1 + 2 * b].buffer().ptr(), keys[b].buffer().ptr());
      EXPECT_TRUE(mx::array_equal(keys[b], buffer(c, b, 0, seed)).item<bool>())
          << "a buffer the cache did not vouch for was written";
      EXPECT_TRUE(mx::array_equal(values[b], buffer(c, b, 1, seed)).item<bool>());
    }
    // The per-row MLX ops in float32.
    auto f32 = [](const mx::array& x) { return mx::astype(x, mx::float32); };
    mx::array K = mx::slice(f32(want_k), {0, 0, 0, 0}, to);
    mx::array V = mx::slice(f32(want_v), {0, 0, 0, 0}, to);
    mx::array qb = mx::reshape(f32(row(q)), {1, c.Hkv, G, c.D});
    mx::array s = mx::multiply(mx::matmul(qb, mx::transpose(K, {0, 1, 3, 2})), mx::array(scale));
    mx::array ref = mx::reshape(mx::matmul(mx::softmax(s, -1, true), V), {1, c.Hq, 1, c.D});
    mx::array got = f32(row(out[0]));
    EXPECT_FALSE(mx::any(mx::isnan(got)).item<bool>()) << "an output element was not written";
    const float err = mx::sqrt(mx::sum(mx::square(mx::subtract(got, ref)))).item<float>() /
                      mx::sqrt(mx::sum(mx::square(ref))).item<float>();
    EXPECT_LT(err, c.tol);
  }
}

TEST(GpuRowsAttention, MatchesPerRowOpsAcrossShapesAndDtypes) {
  LMX_NEEDS_GPU();
  const std::vector<Case> cases = {
      // GQA 4 (4 heads a block), one row at the last position of its buffer, mixed in-place.
      {mx::bfloat16,
       128,
       32,
       8,
       {0, 1, 130, 255, 37},
       {256, 256, 256, 256, 512},
       {true, false, true, true, false},
       1e-2},
      // GQA 3 (one head a block), a long row split over blocks.
      {mx::float16, 64, 12, 4, {3, 700, 64}, {1024, 1024, 256}, {true, true, false}, 2e-3},
      // float32: the reference's matmuls run on cuBLAS in TF32 on the GPU (MLX_ENABLE_TF32, on
      // by default), ~1e-3 relative; on an H100 this row measured 1.9e-4 and 4.0e-4 against it.
      {mx::float32, 256, 8, 4, {5, 300}, {256, 512}, {false, true}, 2e-3},
      // One row, 3000 positions: many splits.
      {mx::bfloat16, 128, 16, 8, {3000}, {3072}, {true}, 1e-2},
      {mx::float16, 128, 32, 8, {17, 90}, {256, 256}, {true, true}, 2e-3},
      {mx::float32, 64, 4, 4, {0, 9}, {256, 256}, {true, false}, 2e-3},
  };
  uint64_t seed = 11;
  for (const Case& c : cases) run_case(c, seed += 10);
}

TEST(GpuRowsAttention, MoreRowsThanOneLaunchTakes) {
  LMX_NEEDS_GPU();
  std::mt19937 rng(5);
  Case c{mx::bfloat16, 64, 8, 8, {}, {}, {}, 1e-2};
  for (int b = 0; b < 70; ++b) {
    c.offsets.push_back(static_cast<int>(rng() % 300));
    c.caps.push_back(512);
    c.in_place.push_back(b % 5 != 0);
  }
  run_case(c, 77);
}

TEST(GpuRowsAttention, BadShapesAreRefusedNamingThem) {
  mx::array q = mx::zeros({2, 8, 2, 64}, mx::bfloat16);  // two positions: not a decode step
  mx::array k = mx::zeros({2, 4, 1, 64}, mx::bfloat16);
  std::vector<mx::array> bufs = {mx::zeros({1, 4, 256, 64}, mx::bfloat16),
                                 mx::zeros({1, 4, 256, 64}, mx::bfloat16)};
  try {
    kernels::cuda::rows_decode_attention(q, k, k, bufs, bufs, {0, 0}, {true, true}, 0.125f);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda rows_decode_attention"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("(B, Hq, 1, D)"), std::string::npos) << e.what();
  }
}

TEST(GpuRowsAttention, BadBuffersAreRefusedNamingTheRow) {
  LMX_NEEDS_GPU();
  mx::array q = mx::zeros({2, 8, 1, 64}, mx::bfloat16);
  mx::array k = mx::zeros({2, 4, 1, 64}, mx::bfloat16);
  std::vector<mx::array> bufs = {mx::zeros({1, 4, 256, 64}, mx::bfloat16),
                                 mx::zeros({1, 4, 8, 64}, mx::bfloat16)};
  try {
    kernels::cuda::rows_decode_attention(q, k, k, bufs, bufs, {0, 8}, {true, true}, 0.125f);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lmx
