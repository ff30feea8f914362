// The L3 causal attention kernel against mx::fast::scaled_dot_product_attention (causal, bottom-
// right aligned) on random inputs: GQA ratios, queries at an offset into the keys, a key view
// sliced out of a larger buffer as a KV cache returns it, float32, bfloat16 and float16; up to 8
// query rows read K and V in place, more convert them to float32 first; D = 40 has a tail past
// the vector width; S past 128 splits decode keys into chunks whose partial sums merge; every ISA
// kernel the CPU runs.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "cache/kv_cache.h"
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

namespace lmx {
namespace {

kc::QLinear random_linear(int out, int in, uint64_t seed) {
  mx::array w = mx::multiply(mx::random::normal({out, in}, mx::float32, mx::random::key(seed)),
                             mx::array(0.05f));
  auto q = mx::quantize(w, 64, 4);
  return {q[0], q[1], q[2], 64, 4, std::nullopt};
}

// decoder_layer against the three primitives it fuses, composed with the cache's own
// update_and_fetch, over several steps (a prefill chunk, then single tokens): equal outputs, and
// a cache whose buffers the layer grows and writes in place unless it has handed them out.
TEST(DecoderLayer, MatchesTheComposedPrimitives) {
  const int D = 128, Hq = 4, Hkv = 2, hd = 32, I = 192;
  kc::DecoderLayerWeights w{mx::random::uniform({D}, mx::float32, mx::random::key(1)),
                            random_linear(Hq * hd, D, 2),
                            random_linear(Hkv * hd, D, 3),
                            random_linear(Hkv * hd, D, 4),
                            std::nullopt,
                            random_linear(D, Hq * hd, 5),
                            mx::random::uniform({D}, mx::float32, mx::random::key(6)),
                            random_linear(I, D, 7),
                            random_linear(I, D, 8),
                            random_linear(D, I, 9)};
  kc::DecoderLayerSpec spec;
  spec.qkv = {Hq, Hkv, hd, 1e-5f, {hd, false, 10000.0f, 1.0f}, std::nullopt};
  spec.attn_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // (activation dtype, cache dtype): L3 keeps float32 models' K and V as float16.
  const std::vector<std::pair<mx::Dtype, mx::Dtype>> dtypes = {
      {mx::float32, mx::float32}, {mx::bfloat16, mx::bfloat16}, {mx::float32, mx::float16}};
  for (auto [dt, cdt] : dtypes) {
    KVCache fused, composed;
    uint64_t seed = 100;
    const void* prev = nullptr;  // the keys buffer after the previous step
    std::vector<mx::array> held, snapshot;
    const std::vector<int> steps = {13, 1, 1, 1, 1, 250, 1, 1};  // 269 rows: growth past 256
    for (size_t i = 0; i < steps.size(); ++i) {
      const int L = steps[i];
      mx::array x =
          mx::astype(mx::random::normal({1, L, D}, mx::float32, mx::random::key(seed++)), dt);
      const int offset = fused.offset();
      const bool grows = offset + L > fused.capacity();
      std::vector<mx::array> out;
      bool in_place = false;
      {
        auto buf = fused.reserve(1, Hkv, hd, hd, cdt, L);
        in_place = buf.in_place;
        out = kc::decoder_layer(x, buf.keys, buf.values, offset, w, spec, buf.in_place);
      }
      fused.commit(out[1], out[2], L);
      auto qkv = kc::norm_qkv_rope(x, w.input_norm, w.q, w.k, w.v, spec.qkv, offset);
      auto [keys, values] =
          composed.update_and_fetch(mx::astype(qkv[1], cdt), mx::astype(qkv[2], cdt));
      mx::array attn = kc::causal_attention(qkv[0], keys, values, spec.attn_scale);
      mx::array want =
          kc::out_proj_mlp(x, attn, w.o, w.post_norm, spec.mlp_norm_eps, w.gate, w.up, w.down);
      mx::eval({out[0], out[1], want});
      EXPECT_EQ(out[1].dtype(), cdt);
      EXPECT_TRUE(mx::array_equal(out[0], want).item<bool>()) << "L=" << L << " " << dt << cdt;
      // Fresh buffers and the cache's own are written where they lie; step 3, after the cache
      // handed its arrays out (state()), must not: the arrays held since keep their contents.
      EXPECT_EQ(in_place, i != 3) << "step " << i;
      if (i > 0 && in_place && !grows) {
        EXPECT_EQ(out[1].data<void>(), prev) << "step " << i;
      }
      if (i == 3) {
        EXPECT_NE(out[1].data<void>(), prev);
      }
      prev = out[1].data<void>();
      if (i == 2) {
        held = fused.state();
        for (const auto& a : held) snapshot.push_back(mx::copy(a));
        mx::eval(snapshot);
      }
    }
    for (size_t j = 0; j < held.size(); ++j)
      EXPECT_TRUE(mx::array_equal(held[j], snapshot[j]).item<bool>()) << "held state " << j;
    ASSERT_EQ(fused.offset(), composed.offset());
    auto fs = fused.state(), cs = composed.state();
    ASSERT_EQ(fs.size(), cs.size());
    for (size_t j = 0; j < fs.size(); ++j) {
      // Rows past the offset are padding in either cache.
      const int n = fused.offset();
      EXPECT_TRUE(mx::array_equal(seq_slice(fs[j], 0, n), seq_slice(cs[j], 0, n)).item<bool>())
          << "cache " << j;
    }
  }
}

TEST(DecoderLayer, BadCacheBuffersAreErrors) {
  const int D = 64;
  kc::DecoderLayerWeights w{mx::ones({D}),
                            random_linear(64, D, 1),
                            random_linear(64, D, 2),
                            random_linear(64, D, 3),
                            std::nullopt,
                            random_linear(D, 64, 4),
                            mx::ones({D}),
                            random_linear(128, D, 5),
                            random_linear(128, D, 6),
                            random_linear(D, 128, 7)};
  kc::DecoderLayerSpec spec;
  spec.qkv = {2, 2, 32, 1e-5f, {32, false, 10000.0f, 1.0f}, std::nullopt};
  mx::array x = mx::zeros({1, 4, D});
  mx::array small = mx::zeros({1, 2, 3, 32});  // room for 3 rows, not 4
  EXPECT_THROW(kc::decoder_layer(x, small, small, 0, w, spec), Error);
  mx::array wrong = mx::zeros({1, 3, 8, 32});  // 3 KV heads, the layer has 2
  EXPECT_THROW(kc::decoder_layer(x, wrong, wrong, 0, w, spec), Error);
  mx::array ok = mx::zeros({1, 2, 8, 32});
  EXPECT_THROW(kc::decoder_layer(x, ok, ok, 6, w, spec), Error);  // offset 6 + 4 rows > 8
  mx::array half = mx::zeros({1, 2, 8, 32}, mx::float16);
  EXPECT_THROW(kc::decoder_layer(x, half, ok, 0, w, spec), Error);  // keys and values differ
  mx::array ints = mx::zeros({1, 2, 8, 32}, mx::int32);
  EXPECT_THROW(kc::decoder_layer(x, ints, ints, 0, w, spec), Error);
}

}  // namespace
}  // namespace lmx
