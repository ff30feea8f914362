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
#include "cache/rotating_kv_cache.h"
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

// Gemma's layer (sandwich norms, q/k head norms, GeGLU) over a RotatingKVCache of the sliding
// window (ring_reserve / ring_commit) against the same layer in MLX ops over another ring
// (dequantized weights, update_and_fetch, mx.fast attention with the ring's windowed mask),
// through growth, the wrap, multi-token writes past the window and single tokens after them;
// and over a plain KVCache with the window (a sliding layer given a plain cache).
TEST(DecoderLayer, GemmaLayerOverARingMatchesMlxOps) {
  const int D = 128, Hq = 4, Hkv = 2, hd = 32, I = 192, W = 8;
  auto norm_w = [](uint64_t seed) {
    return mx::random::uniform(0.5f, 1.5f, {D}, mx::float32, mx::random::key(seed));
  };
  kc::DecoderLayerWeights w{
      norm_w(1),
      random_linear(Hq * hd, D, 2),
      random_linear(Hkv * hd, D, 3),
      random_linear(Hkv * hd, D, 4),
      kc::QkNorm{mx::random::uniform(0.5f, 1.5f, {hd}, mx::float32, mx::random::key(10)),
                 mx::random::uniform(0.5f, 1.5f, {hd}, mx::float32, mx::random::key(11))},
      random_linear(D, Hq * hd, 5),
      norm_w(6),
      random_linear(I, D, 7),
      random_linear(I, D, 8),
      random_linear(D, I, 9),
      kc::SandwichNorms{norm_w(12), norm_w(13)}};
  kc::DecoderLayerSpec spec;
  spec.qkv = {Hq, Hkv, hd, 1e-6f, {hd, false, 10000.0f, 0.5f}, 1e-6f};
  spec.attn_scale = 0.2f;
  spec.mlp_norm_eps = 1e-6f;
  spec.act = kc::Activation::gelu_approx;
  auto deq = [](const kc::QLinear& l) {
    return mx::dequantize(l.w, l.scales, l.biases, l.group_size, l.bits);
  };
  auto lin = [&](const mx::array& x, const kc::QLinear& l) {
    return mx::matmul(x, mx::transpose(deq(l)));
  };
  auto rms = [](const mx::array& x, const mx::array& wt, float eps) {
    return mx::fast::rms_norm(x, wt, eps);
  };
  auto heads = [](const mx::array& x, int H) {
    return mx::transpose(mx::reshape(x, {x.shape(0), x.shape(1), H, -1}), {0, 2, 1, 3});
  };
  // The reference layer over `cache` with its mask.
  auto reference = [&](const mx::array& x, KVCacheBase& cache) {
    const int L = x.shape(1), offset = cache.offset();
    const Mask mask = cache.make_mask(L, W);
    mx::array n = rms(x, w.input_norm, spec.qkv.norm_eps);
    mx::array q = rms(heads(lin(n, w.q), Hq), w.qk_norm->q, 1e-6f);
    mx::array k = rms(heads(lin(n, w.k), Hkv), w.qk_norm->k, 1e-6f);
    mx::array v = heads(lin(n, w.v), Hkv);
    q = mx::fast::rope(q, hd, false, 10000.0f, 0.5f, offset);
    k = mx::fast::rope(k, hd, false, 10000.0f, 0.5f, offset);
    auto [keys, values] = cache.update_and_fetch(k, v);
    mx::array a =
        mask.array
            ? mx::fast::scaled_dot_product_attention(q, keys, values, 0.2f, "array", mask.array)
            : mx::fast::scaled_dot_product_attention(q, keys, values, 0.2f, mask.mode);
    a = mx::reshape(mx::transpose(a, {0, 2, 1, 3}), {1, L, -1});
    mx::array h = mx::add(x, rms(lin(a, w.o), w.sandwich->attn_out, 1e-6f));
    mx::array m = rms(h, w.post_norm, 1e-6f);
    mx::array g = lin(m, w.gate);
    mx::array gelu = mx::multiply(
        mx::multiply(mx::array(0.5f), g),
        mx::add(mx::array(1.0f),
                mx::tanh(mx::multiply(mx::array(0.7978845608f),
                                      mx::add(g, mx::multiply(mx::array(0.044715f),
                                                              mx::power(g, mx::array(3.0f))))))));
    mx::array y = lin(mx::multiply(gelu, lin(m, w.up)), w.down);
    return mx::add(h, rms(y, w.sandwich->mlp_out, 1e-6f));
  };
  const std::vector<int> steps = {5, 1, 1, 1, 1, 1, 3, 1, 1, 8, 1, 2, 1, 1, 1, 1, 1, 1, 1, 4, 1};
  for (bool ring_cache : {true, false}) {
    RotatingKVCache ring(W), ref_ring(W);
    KVCache plain, ref_plain;
    KVCacheBase& ref = ring_cache ? static_cast<KVCacheBase&>(ref_ring) : ref_plain;
    uint64_t seed = 300;
    for (size_t i = 0; i < steps.size(); ++i) {
      const int L = steps[i];
      mx::array x = mx::random::normal({1, L, D}, mx::float32, mx::random::key(seed++));
      mx::array want = reference(x, ref);
      std::vector<mx::array> out;
      if (ring_cache) {
        const int offset = ring.offset();
        auto s = ring.ring_reserve(1, Hkv, L, {{hd, mx::float32}, {hd, mx::float32}});
        out = kc::decoder_layer(x, s.parts[0], s.parts[1], offset, w, spec, s.in_place,
                                {s.pos, s.rows, W});
        ring.ring_commit({out[1], out[2]}, L);
      } else {
        const int offset = plain.offset();
        auto buf = plain.reserve(1, Hkv, hd, hd, mx::float32, L);
        out = kc::decoder_layer(x, buf.keys, buf.values, offset, w, spec, buf.in_place,
                                {offset, offset + L, W});
        plain.commit(out[1], out[2], L);
      }
      mx::eval({out[0], want});
      // The kernels quantize activations to two int8 limbs (~1e-4 relative, docs/cpu.md).
      const float err = mx::max(mx::abs(mx::subtract(out[0], want))).item<float>();
      const float scale = mx::max(mx::abs(want)).item<float>();
      EXPECT_LT(err, 2e-3f * scale) << (ring_cache ? "ring" : "plain") << " step " << i;
    }
    if (ring_cache) {
      EXPECT_EQ(ring.offset(), ref_ring.offset());
      EXPECT_EQ(ring.idx(), ref_ring.idx());
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

// The gated MLP's activation (kernels' gate_act, used by out_proj_mlp): SiLU and gelu_approx
// against the formulas in double, on every ISA this CPU has, from deep in either tail (where
// e^x over- or underflows) to the middle; each element's result independent of its position
// (the vector body against the tail).
TEST(GateAct, MatchesTheFormulasOnEveryIsa) {
  std::vector<float> x, u;
  for (float v = -40.0f; v <= 40.0f; v += 0.37f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-6f, -1e-6f, 100.0f, -100.0f, 3e4f, -3e4f}) x.push_back(v);
  for (size_t i = 0; i < x.size(); ++i) u.push_back(0.5f + static_cast<float>(i % 7) * 0.25f);
  for (kc::Isa isa : {kc::Isa::generic, kc::Isa::avx2, kc::Isa::avx512}) {
    if (!kc::isa_available(isa)) continue;
    const kc::GateActFn f = kc::kernels_for(isa).gate_act;
    ASSERT_NE(f, nullptr);
    for (bool gelu : {false, true}) {
      std::vector<float> g = x;
      f(g.data(), u.data(), static_cast<long>(g.size()), gelu);
      for (size_t i = 0; i < x.size(); ++i) {
        const double v = x[i];
        // 0.5 v (1 + tanh(y)) = v / (1 + e^-2y), without the cancellation of 1 + tanh(y) in
        // the far negative tail.
        const double y = 0.7978845608028654 * (v + 0.044715 * v * v * v);
        const double act = gelu ? v / (1.0 + std::exp(-2.0 * y)) : v / (1.0 + std::exp(-v));
        const double want = act * u[i];
        EXPECT_NEAR(g[i], want, 4e-6 * std::abs(want) + 1e-9)
            << kc::isa_name(isa) << (gelu ? " gelu" : " silu") << " x = " << x[i];
        // The same element alone (the tail path) gives the same bits.
        float one = x[i];
        f(&one, &u[i], 1, gelu);
        EXPECT_EQ(one, g[i]) << kc::isa_name(isa) << " x = " << x[i];
      }
    }
  }
}

}  // namespace
}  // namespace lmx
