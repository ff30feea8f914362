// Tier L3 of the dense decoder layer: rms_norm + Q/K/V + RoPE and o_proj + residual + rms_norm +
// SwiGLU MLP + residual each run as one CPU primitive (kernels/cpu/fused.h) with MLX's attention
// between them; over a plain KV cache the whole layer, attention and cache write included, is a
// single primitive; batched rows (RowsKVCache) take the two primitives with each row's attention
// between them. Layers with LoRA adapters, biases outside Q/K/V or a RoPE with a frequency table
// run the op-by-op path.
#include "cache/rows_cache.h"
#include "kernels/cpu/fused.h"
#include "nn/adapter_router.h"
#include "nn/transformer.h"

namespace lmx::nn {

namespace {

bool fusable(const Linear& l, bool bias_ok) {
  return l.cpu_kernel && l.adapters.empty() && !l.routed.active() && (bias_ok || !l.bias);
}

kernels::cpu::QLinear qlinear(const Linear& l) {
  return {l.weight, *l.scales, *l.biases, l.quant->group_size, l.quant->bits, l.bias};
}

}  // namespace

std::optional<mx::array> DecoderBlock::fused(const mx::array& x, const Mask& mask,
                                             KVCacheBase& cache) const {
  const Attention& a = self_attn;
  const RoPE& r = a.opt.rope;
  // Only llama's layer shape fuses: pre-norms, separate projections, per-head q/k norms, RoPE
  // over the whole head, no residual multiplier.
  const bool llama_shape = norms == NormPlacement::pre && !residual_multiplier && a.q_proj &&
                           mlp.gate_proj && a.opt.use_rope && !a.opt.qk_norm_over_projection &&
                           r.dims == a.opt.head_dim;
  if (!llama_shape) return std::nullopt;
  const bool ok = fusable(*a.q_proj, true) && fusable(*a.k_proj, true) &&
                  fusable(*a.v_proj, true) && fusable(a.o_proj, false) &&
                  fusable(*mlp.gate_proj, false) && fusable(*mlp.up_proj, false) &&
                  fusable(mlp.down_proj, false) && r.base && !r.freqs && !r.dynamic &&
                  r.mscale == 1.0f && x.ndim() == 3;
  if (!ok) return std::nullopt;
  kernels::cpu::QkvSpec spec{a.opt.n_heads,
                             a.opt.n_kv_heads,
                             a.opt.head_dim,
                             input_layernorm->eps,
                             {r.dims, r.traditional, *r.base, r.scale},
                             std::nullopt};
  std::optional<kernels::cpu::QkNorm> qk_norm;
  if (a.q_norm) {
    spec.qk_norm_eps = a.q_norm->eps;
    qk_norm = kernels::cpu::QkNorm{a.q_norm->weight, a.k_norm->weight};
  }
  auto* kv = dynamic_cast<KVCache*>(&cache);
  if (kv && (mask.none() || (!mask.array && mask.mode == "causal"))) {
    // A plain cache returns keys in position order, so the causal mask needs no array: the
    // whole layer, cache write included, is one primitive.
    const int B = x.shape(0), L = x.shape(1), H = a.opt.n_kv_heads, hd = a.opt.head_dim;
    // float32 activations keep K and V as float16, as llama.cpp's default cache does: half the
    // bytes attention streams a token (docs/cpu.md).
    const mx::Dtype kv_dtype = x.dtype() == mx::float32 ? mx::float16 : x.dtype();
    auto buf = kv->reserve(B, H, hd, hd, kv_dtype, L);
    kernels::cpu::DecoderLayerWeights w{input_layernorm->weight,
                                        qlinear(*a.q_proj),
                                        qlinear(*a.k_proj),
                                        qlinear(*a.v_proj),
                                        qk_norm,
                                        qlinear(a.o_proj),
                                        post_attention_layernorm->weight,
                                        qlinear(*mlp.gate_proj),
                                        qlinear(*mlp.up_proj),
                                        qlinear(mlp.down_proj)};
    auto out =
        kernels::cpu::decoder_layer(x, buf.keys, buf.values, kv->offset(), w,
                                    {spec, a.scale, post_attention_layernorm->eps}, buf.in_place);
    kv->commit(out[1], out[2], L);
    return out[0];
  }
  // Batched rows (continuous batching) each rotate at their own position; their attention runs
  // per row on the row's cache (the rows kernel over plain caches).
  auto qkv = kernels::cpu::norm_qkv_rope(x, input_layernorm->weight, qlinear(*a.q_proj),
                                         qlinear(*a.k_proj), qlinear(*a.v_proj), spec,
                                         rope_offsets(cache), qk_norm);
  mx::array attn = merge_heads(cached_attention(qkv[0], qkv[1], qkv[2], cache, a.scale, mask));
  return kernels::cpu::out_proj_mlp(x, attn, qlinear(a.o_proj), post_attention_layernorm->weight,
                                    post_attention_layernorm->eps, qlinear(*mlp.gate_proj),
                                    qlinear(*mlp.up_proj), qlinear(mlp.down_proj));
}

}  // namespace lmx::nn
