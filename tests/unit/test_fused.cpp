// The L3 causal attention kernel against mx::fast::scaled_dot_product_attention (causal, bottom-
// right aligned) on random inputs: GQA ratios, queries at an offset into the keys, a key view
// sliced out of a larger buffer as a KV cache returns it, float32, bfloat16 and float16; up to 8
// query rows read K and V in place, more convert them to float32 first; D = 40 has a tail past
// the vector width; S past 128 splits decode keys into chunks whose partial sums merge; every ISA
// kernel the CPU runs.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/fused.h"

namespace lmx {
namespace {

namespace kc = kernels::cpu;
namespace mx = mlx::core;

TEST(CausalAttention, MatchesMlxSdpa) {
  uint64_t seed = 1;
  // (Hq, Hkv, L, S, D)
  const std::vector<std::tuple<int, int, int, int, int>> shapes = {
      {4, 4, 1, 9, 64},   {8, 2, 5, 5, 32},   {6, 1, 3, 17, 64},  {9, 3, 12, 40, 64},
      {4, 2, 2, 7, 40},   {9, 3, 1, 300, 64}, {6, 2, 3, 257, 40}, {4, 4, 16, 200, 128},
      {2, 1, 1, 50, 256}, {16, 2, 2, 130, 64}};
  for (auto [Hq, Hkv, L, S, D] : shapes)
    for (kc::Isa isa : {kc::Isa::generic, kc::Isa::avx2, kc::Isa::avx512}) {
      if (!kc::isa_available(isa)) continue;
      for (mx::Dtype dt : {mx::float32, mx::bfloat16, mx::float16}) {
        auto rnd = [&](mx::Shape s) {
          return mx::astype(mx::random::normal(s, mx::float32, mx::random::key(seed++)), dt);
        };
        mx::array q = rnd({2, Hq, L, D});
        // Keys and values as the first S rows of a 64-row buffer (a non-contiguous view).
        mx::array kb = rnd({2, Hkv, S + 7, D}), vb = rnd({2, Hkv, S + 7, D});
        mx::array k = mx::slice(kb, {0, 0, 0, 0}, {2, Hkv, S, D});
        mx::array v = mx::slice(vb, {0, 0, 0, 0}, {2, Hkv, S, D});
        const float scale = 1.0f / 8;
        mx::array got = kc::causal_attention(q, k, v, scale, isa);
        mx::array want = mx::fast::scaled_dot_product_attention(
            mx::astype(q, mx::float32), mx::astype(k, mx::float32), mx::astype(v, mx::float32),
            scale, L > 1 ? "causal" : "");
        want = mx::reshape(mx::transpose(want, {0, 2, 1, 3}), {2, L, Hq * D});
        ASSERT_EQ(got.shape(), want.shape());
        ASSERT_EQ(got.dtype(), dt);
        const float err =
            mx::max(mx::abs(mx::subtract(mx::astype(got, mx::float32), want))).item<float>();
        EXPECT_LE(err, dt == mx::float32 ? 1e-5f : 2e-2f)
            << "Hq=" << Hq << " Hkv=" << Hkv << " L=" << L << " S=" << S << " D=" << D << " " << dt
            << " " << kc::isa_name(isa);
      }
    }
}

TEST(CausalAttention, BadShapesAreErrors) {
  mx::array q = mx::zeros({1, 6, 2, 64}), k = mx::zeros({1, 4, 8, 64});
  EXPECT_THROW(kc::causal_attention(q, k, k, 1.0f), Error);  // 6 heads over 4 KV heads
  EXPECT_THROW(kc::causal_attention(mx::zeros({1, 4, 9, 64}), k, k, 1.0f), Error);  // L > S
  mx::array big = mx::zeros({1, 1, 2, 320});
  EXPECT_THROW(kc::causal_attention(big, big, big, 1.0f), Error);  // head_dim above 256
}

}  // namespace
}  // namespace lmx
