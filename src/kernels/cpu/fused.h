// Fused pieces of a dense decoder layer on the CPU kernels (tier L3), so that a layer costs a
// few MLX dispatches instead of ~27: norm + Q/K/V + RoPE in one primitive, output projection +
// residual + norm + SwiGLU MLP + residual in another. All arithmetic in float32.
#pragma once

#include <mlx/mlx.h>

#include <optional>
#include <vector>

#include "kernels/cpu/qmm.h"

namespace lmx::kernels::cpu {

// One affine-quantized linear layer the kernels support (qmm.h supports()).
struct QLinear {
  mx::array w, scales, biases;
  int group_size = 64, bits = 4;
  std::optional<mx::array> bias;  // the additive layer bias, (N,)
};

// mx::fast::rope with a base (no frequency table): theta_i = (offset + l) * scale * base^(-i /
// (dims / 2)); the first `dims` features of each head rotate, as halves or as pairs.
struct RopeSpec {
  int dims = 0;
  bool traditional = false;
  float base = 10000.0f;
  float scale = 1.0f;
};

struct QkvSpec {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float norm_eps = 1e-5f;
  RopeSpec rope;
  std::optional<float> qk_norm_eps;  // qwen3: rms_norm of each q / k head before RoPE
};

// qwen3's per-head norms, (head_dim,) each; used when QkvSpec::qk_norm_eps is set.
struct QkNorm {
  mx::array q, k;
};

// x (B, L, D) -> {q (B, n_heads, L, head_dim), k and v (B, n_kv_heads, L, head_dim)}, in x's
// dtype: rms_norm(x) * norm_weight, the three projections, the q / k head norms if any, RoPE
// at `offset` on q and k.
std::vector<mx::array> norm_qkv_rope(const mx::array& x, const mx::array& norm_weight,
                                     const QLinear& q, const QLinear& k, const QLinear& v,
                                     const QkvSpec& spec, int offset,
                                     const std::optional<QkNorm>& qk_norm = std::nullopt);
// The same for batched rows at their own positions: row b rotates at offsets[b] .. (continuous
// batching; a row computes what it computes alone).
std::vector<mx::array> norm_qkv_rope(const mx::array& x, const mx::array& norm_weight,
                                     const QLinear& q, const QLinear& k, const QLinear& v,
                                     const QkvSpec& spec, const std::vector<int>& offsets,
                                     const std::optional<QkNorm>& qk_norm = std::nullopt);

// The MLP's gate activation: silu (SwiGLU, llama) or mlx.nn.gelu_approx (GeGLU, gemma).
enum class Activation { silu, gelu_approx };

// Gemma's sandwich norms around both sublayers' outputs, (D,) each, eps the MLP norm's: h1 = h +
// rms_norm(o(attn)) * attn_out; out = h1 + rms_norm(mlp(n)) * mlp_out.
struct SandwichNorms {
  mx::array attn_out, mlp_out;
};

// h (B, L, D), attn (B, L, n_heads * head_dim) -> h1 + down(act(gate(n)) * up(n)) with
// h1 = h + o(attn) and n = rms_norm(h1) * norm_weight, in h's dtype; with sandwich norms each
// branch is normed before its add (and float16 sums are clipped to float16's range).
mx::array out_proj_mlp(const mx::array& h, const mx::array& attn, const QLinear& o,
                       const mx::array& norm_weight, float norm_eps, const QLinear& gate,
                       const QLinear& up, const QLinear& down, Activation act = Activation::silu,
                       const std::optional<SandwichNorms>& sandwich = std::nullopt);

struct DecoderLayerWeights {
  mx::array input_norm;
  QLinear q, k, v;
  std::optional<QkNorm> qk_norm;
  QLinear o;
  mx::array post_norm;  // the norm before the MLP (gemma: pre_feedforward_layernorm)
  QLinear gate, up, down;
  std::optional<SandwichNorms> sandwich = std::nullopt;
};

struct DecoderLayerSpec {
  QkvSpec qkv;
  float attn_scale = 1.0f;
  float mlp_norm_eps = 1e-5f;
  Activation act = Activation::silu;
};

// Where a decoder_layer step's K and V rows go in the cache buffers and what attention reads.
// The default (pos < 0): a plain cache, rows [offset, offset + L) written, rows [0, offset + L)
// read. A ring (RotatingKVCache) writes at pos and reads rows [0, rows): for L > 1 the new rows
// are the last ones (pos + L == rows), for L == 1 the ring may hold its rows in any order (one
// query needs no order). window > 0: query l also skips keys more than window - 1 rows before
// its own (mlx-lm's windowed causal mask).
struct KvSlots {
  int pos = -1, rows = -1;
  int window = 0;
};

// A whole dense decoder layer as one primitive, over a plain KV cache or a ring (slots):
// norm_qkv_rope at position offset, K and V written into rows [offset, offset + L) (or slots.pos
// ..) of the cache buffers keys, values (B, n_kv_heads, capacity, head_dim) of one float dtype
// (x's, or float16 under float32 x: the rounding is the cache's), causal attention over rows [0,
// offset + L) (or slots.rows, windowed), out_proj_mlp (with w.sandwich and spec.act: gemma's
// layer; float16 activations are clipped to float16's range, as gemma's clip_residual).
// Returns {h (B, L, D), keys, values}: the buffers with the new rows. in_place: the caller (the
// KV cache) vouches that no other array shares keys' and values' memory, and the outputs share
// it (as MLX's slice_update on a donated buffer); otherwise they are copies. The same
// arithmetic, in the same order, as the three primitives composed with a slice_update.
std::vector<mx::array> decoder_layer(const mx::array& x, const mx::array& keys,
                                     const mx::array& values, int offset,
                                     const DecoderLayerWeights& w, const DecoderLayerSpec& spec,
                                     bool in_place = false, const KvSlots& slots = {});

// Causal attention, bottom-right aligned (query l of L sees keys 0 .. S - L + l), of q (B, Hq, L,
// D) against k, v (B, Hkv, S, D) with a unit-stride last axis (a KV cache's view); Hq / Hkv
// query heads share each KV head; D <= 256. Returns (B, L, Hq * D), the heads merged, in q's
// dtype. `isa` forces a kernel (tests); by default the best the CPU has.
mx::array causal_attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
                           std::optional<Isa> isa = std::nullopt);

// Decode attention of B independent rows (continuous batching), each over its own KV cache:
// row b's new key and value (k_new, v_new (B, Hkv, 1, D), row b) are written at position
// offsets[b] of keys[b], values[b] ((1, Hkv, capacity_b, D), a float dtype), and its query
// (q (B, Hq, 1, D), row b) attends over positions [0, offsets[b]]. Returns the output (B, Hq, 1,
// D) in q's dtype, then each row's key and value buffers: written where they lie when
// in_place[b] (KVCache::reserve's word), else copies. One primitive for what is otherwise a few
// MLX ops per row and layer.
std::vector<mx::array> rows_decode_attention(const mx::array& q, const mx::array& k_new,
                                             const mx::array& v_new,
                                             const std::vector<mx::array>& keys,
                                             const std::vector<mx::array>& values,
                                             const std::vector<int>& offsets,
                                             const std::vector<bool>& in_place, float scale);

}  // namespace lmx::kernels::cpu
