// The layers mlx-lm's dense decoders use, with mlx.nn's op order (bit-exact on the same backend).
#pragma once

#include <mlx/mlx.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "models/model.h"

namespace lmx::nn {

namespace mx = mlx::core;

// A hook on a Linear's output, for LoRA (mlx-lm LoRALinear: y = base(x) + residual(x)): gets the
// input and the base output, returns the new output. Adapters run in the order attached.
struct LinearAdapter {
  virtual ~LinearAdapter() = default;
  virtual mx::array operator()(const mx::array& x, const mx::array& y) const = 0;
  // DoRA computes the whole output from x, as the layer's only adapter: the base matmul is
  // skipped and y is a placeholder.
  virtual bool replaces_base() const { return false; }
};

// The same for an Embedding (mlx-lm LoRAEmbedding): the lookup of `ids` and the tied head.
struct EmbeddingAdapter {
  virtual ~EmbeddingAdapter() = default;
  virtual mx::array lookup(const mx::array& ids, const mx::array& y) const = 0;
  virtual mx::array as_linear(const mx::array& x, const mx::array& y) const = 0;
};

// And for a SwitchLinear (mlx-lm LoRASwitchLinear): x rows, the expert ids, whether sorted.
struct SwitchAdapter {
  virtual ~SwitchAdapter() = default;
  virtual mx::array operator()(const mx::array& x, const mx::array& indices, bool sorted_indices,
                               const mx::array& y) const = 0;
};

struct Linear;
struct Embedding;
class AdapterRouter;

// A module's place among the adapters chosen per request (nn/adapter_router.h).
struct RoutedSite {
  std::shared_ptr<AdapterRouter> router;  // null: the model takes no per-request adapters
  int site = -1;
  bool active() const;  // a routed adapter changes this module in the current forward
};

// Where Linear::load and Embedding::load get a module's adapters once its tensors are taken
// (LoRA adapters, src/lora/), by the module's path and logical sizes.
struct AdapterSource {
  virtual ~AdapterSource() = default;
  virtual std::vector<std::shared_ptr<const LinearAdapter>> linear(const std::string& path,
                                                                   const Linear& base, int in,
                                                                   int out) = 0;
  virtual std::vector<std::shared_ptr<const EmbeddingAdapter>> embedding(const std::string& path,
                                                                         const Embedding& base,
                                                                         int vocab, int dims) = 0;
  virtual std::vector<std::shared_ptr<const SwitchAdapter>> switch_linear(const std::string& path,
                                                                          int in, int out,
                                                                          int experts) = 0;
};

// The reduction of mlx.nn's (Quantized)ShardedToAllLinear: the rank's partial product is summed
// over the group, then the layer bias (whole on every rank) is added. Defined in nn/shard.cpp.
struct AllReduce {
  mx::distributed::Group group;
  std::optional<mx::array> bias;
  mx::array operator()(const mx::array& partial) const;
};

// nn.Linear or nn.QuantizedLinear. `bias` is the additive layer bias, applied after the matmul;
// `biases` are the affine zero points of a quantized weight.
struct Linear {
  mx::array weight{0.0f};  // (out, in) or packed (out, in * bits / 32)
  std::optional<mx::array> scales, biases, bias;
  std::optional<QuantSpec> quant;
  bool cpu_kernel = false;   // tier L3: the quantized matmul runs kernels/cpu/qmm.h
  bool cuda_kernel = false;  // tier L3 on CUDA: decode-sized calls run kernels/cuda/qmm.h
  bool from_mxfp4 = false;   // tier L3: an MXFP4 weight held widened (widen_mxfp4_weight)
  std::vector<std::shared_ptr<const LinearAdapter>> adapters;
  RoutedSite routed;
  std::optional<AllReduce> all_reduce;  // tensor parallel, sharded-to-all (nn/shard.h)

  static Linear load(WeightStore& w, const std::string& path, int in, int out, bool has_bias);
  mx::array operator()(const mx::array& x) const;

 private:
  mx::array base(const mx::array& x) const;
};

// Tier L3 on the CPU for an MXFP4 weight (mode "mxfp4", 4 bits, group 32, uint8 scales, no
// biases): its 8-bit affine copy (kernels/cpu/qmm.h widen_mxfp4) replaces the weight, scales,
// biases and spec, so that every reader of the layer sees one layout; its matmuls then give x's
// dtype, as MLX's mxfp4 ones do. False, nothing changed, for other layouts, under
// LMX_CPU_WIDEN=0, and where widen_mxfp4 leaves the weight on MLX's ops.
bool widen_mxfp4_weight(mx::array& weight, std::optional<mx::array>& scales,
                        std::optional<mx::array>& biases, std::optional<QuantSpec>& quant);

// nn.Embedding or nn.QuantizedEmbedding; as_linear is the tied LM head.
struct Embedding {
  mx::array weight{0.0f};  // (vocab, dims) or packed
  std::optional<mx::array> scales, biases;
  std::optional<QuantSpec> quant;
  bool cpu_kernel = false;                // tier L3: as_linear runs kernels/cpu/qmm.h
  bool cuda_kernel = false;               // tier L3 on CUDA: as_linear runs kernels/cuda/qmm.h
  std::optional<mx::Dtype> lookup_dtype;  // L3: the checkpoint's scale dtype, before compacting
  bool packed_in_place = false;           // L3: weight holds the packed copy (qmm.h pack_in_place)
  std::vector<std::shared_ptr<const EmbeddingAdapter>> adapters;
  RoutedSite routed;

  static Embedding load(WeightStore& w, const std::string& path, int vocab, int dims);
  mx::array operator()(const mx::array& ids) const;
  mx::array as_linear(const mx::array& x) const;

 private:
  mx::array lookup(const mx::array& ids) const;
  mx::array head(const mx::array& x) const;
};

struct RMSNorm {
  mx::array weight{0.0f};
  float eps = 1e-5f;

  static RMSNorm load(WeightStore& w, const std::string& path, int dims, float eps);
  mx::array operator()(const mx::array& x) const;
};

// nn.LayerNorm (with bias): mx.fast.layer_norm.
struct LayerNorm {
  mx::array weight{0.0f}, bias{0.0f};
  float eps = 1e-5f;

  static LayerNorm load(WeightStore& w, const std::string& path, int dims, float eps);
  mx::array operator()(const mx::array& x) const;
};

// mlx-lm's initialize_rope: default, linear, dynamic, llama3, yarn.
struct RoPE {
  int dims = 0;
  bool traditional = false;
  std::optional<float> base;
  float scale = 1.0f;
  std::optional<mx::array> freqs;
  float mscale = 1.0f;  // yarn: inputs scaled before rotation
  // dynamic NTK
  bool dynamic = false;
  float dynamic_factor = 1.0f;
  int max_position_embeddings = 0;

  mx::array operator()(const mx::array& x, int offset) const;
  // At the cache's position; a batch of rows (RowsKVCache) rotates each row at its own offset.
  mx::array operator()(const mx::array& x, const KVCacheBase& cache) const;
};

RoPE make_rope(int dims, float base, bool traditional, const json& scaling,
               std::optional<int> max_position_embeddings, const std::string& source);

// mlx-lm's SuScaledRoPE (Phi-3 "su" / "longrope"): frequencies long_factor * base^(i / dims)
// (long_factor one number or dims / 2 of them; short_factor is never used), inputs scaled by
// sqrt(1 + ln(max / original) / ln(original)) when max_position_embeddings exceeds the original.
RoPE su_scaled_rope(int dims, float base, int max_position_embeddings,
                    int original_max_position_embeddings, const json& long_factor,
                    const std::string& source);

// mlx-lm activations.swiglu: silu(gate) * x, compiled (shapeless) as mlx-lm does.
mx::array swiglu(const mx::array& gate, const mx::array& x);

// Tier L3 on CUDA: several layers of one input in one kernel (kernels/cuda/qmm.h), where each is
// a plain quantized matmul on lmx's kernel (no layer bias, adapter or all-reduce; one layout)
// and x a decode-sized input; nullopt otherwise, and the caller runs the layers one by one.
//   cuda_fused_matmuls: (l(x) for l in ls), one to three layers (q, k, v)
//   cuda_fused_add:     residual + l(x)
//   cuda_fused_swiglu:  swiglu(gate(x), up(x))
// With `norm`, x is the norm's input: l(norm(x)) with the norm in the kernel (routing.h
// norm_fold_routed); nullopt where it cannot be, and the caller applies the norm itself.
std::optional<std::vector<mx::array>> cuda_fused_matmuls(const mx::array& x,
                                                         const std::vector<const Linear*>& ls,
                                                         const RMSNorm* norm = nullptr);
std::optional<mx::array> cuda_fused_add(const mx::array& x, const Linear& l,
                                        const mx::array& residual);
std::optional<mx::array> cuda_fused_swiglu(const mx::array& x, const Linear& gate, const Linear& up,
                                           const RMSNorm* norm = nullptr);

// Tier L3 on CUDA: a decode step's per-head q/k norms (both or neither) and RoPE in one kernel
// (kernels/cuda/qmm.h qk_norm_rope): q (B, L, n_heads * head_dim), k (B, L, n_kv_heads *
// head_dim) -> (B, n_heads, L, head_dim), (B, n_kv_heads, L, head_dim), as the norms, the
// transposes and `rope` at the cache's position; nullopt where the kernel does not take them
// (a batch of rows at their own positions, partial or traditional or dynamic rotation, ...).
std::optional<std::pair<mx::array, mx::array>> cuda_qk_norm_rope(
    const mx::array& q, const mx::array& k, const RMSNorm* q_norm, const RMSNorm* k_norm,
    const RoPE& rope, const KVCacheBase& cache, int n_heads, int n_kv_heads, int head_dim);

// mlx.nn.gelu (exact erf form) and mlx.nn.gelu_approx (tanh form), compiled (shapeless) as mlx
// compiles them; the constants are weak scalars (rounded to x's dtype).
mx::array gelu(const mx::array& x);
mx::array gelu_approx(const mx::array& x);

// mlx-lm base.scaled_dot_product_attention for the unquantized cache; `sinks` (n_heads) are
// gpt-oss's per-head attention sinks (an extra logit in every softmax row).
mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
                    const Mask& mask, const std::optional<mx::array>& sinks = std::nullopt);

// mlx-lm base.quantized_scaled_dot_product_attention: q (B, n_heads, L, D) against quantized
// K/V (B, n_kv_heads, S, ...); no fused kernel, scores in the activation dtype, precise softmax.
mx::array quantized_attention(const mx::array& q, const QuantizedArray& k, const QuantizedArray& v,
                              float scale, const Mask& mask, const KVQuantization& quant);

// cache.update_and_fetch(k, v), then the attention mlx-lm's scaled_dot_product_attention picks
// for that cache: quantized for caches with `bits`, mx.fast otherwise. Sinks need mx.fast (a
// quantized cache with sinks is refused, as mlx-lm refuses it).
mx::array cached_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                           KVCacheBase& cache, float scale, const Mask& mask,
                           const std::optional<mx::array>& sinks = std::nullopt);

}  // namespace lmx::nn
