// The dense decoder that llama, qwen2, qwen3 and the llama-like families share (mlx-lm's
// llama.py shape): the families differ in projection biases and fusion, q/k norms, RoPE, where
// the norms sit, scalar multipliers and per-layer sliding windows or NoPE, which the options
// carry. Every option beyond llama's defaults is off by default.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "nn/layers.h"

namespace lmx::nn {

// mlx-lm MLP: down(swiglu(gate(x), up(x))); phi3 and glm4 keep gate and up as one
// gate_up_proj whose output splits in halves, gate first.
struct SwiGLUMLP {
  std::optional<Linear> gate_proj, up_proj, gate_up_proj;
  Linear down_proj;

  static SwiGLUMLP load(WeightStore& w, const std::string& path, int dims, int hidden, bool bias,
                        bool fused_gate_up = false);
  mx::array operator()(const mx::array& x) const;
  // residual + mlp(x), or residual + mlp(pre_norm(x)); on CUDA's tier L3 the down projection
  // and the add are one kernel, and the norm goes into gate and up's.
  mx::array add_to(const mx::array& residual, const mx::array& x,
                   const RMSNorm* pre_norm = nullptr) const;

 private:
  mx::array gated(const mx::array& x, const RMSNorm* pre_norm = nullptr) const;
};

struct AttentionOptions {
  int hidden_size = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  bool qkv_bias = false;
  bool o_bias = false;
  std::optional<float> qk_norm_eps;      // qwen3: RMSNorm over head_dim before RoPE
  bool qk_norm_over_projection = false;  // olmo2: the q/k norms span all heads' projection
  bool fused_qkv = false;                // phi3: one qkv_proj, its output split q | k | v
  std::optional<float> scale;            // granite's attention_multiplier; else head_dim^-0.5
  bool use_rope = true;                  // false: a NoPE layer (smollm3)
  RoPE rope;
};

struct Attention {
  AttentionOptions opt;
  float scale;
  std::optional<Linear> q_proj, k_proj, v_proj, qkv_proj;
  Linear o_proj;
  std::optional<RMSNorm> q_norm, k_norm;

  Attention(const AttentionOptions& o, WeightStore& w, const std::string& path);
  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const;
  // residual + attention(x), or residual + attention(pre_norm(x)); on CUDA's tier L3 the o
  // projection and the add are one kernel, and the norm goes into the q/k/v kernel.
  mx::array add_to(const mx::array& residual, const mx::array& x, const Mask& mask,
                   KVCacheBase& cache, const RMSNorm* pre_norm = nullptr) const;

 private:
  // The heads' attention output before o_proj, (B, L, n_heads * head_dim).
  mx::array attend(const mx::array& x, const Mask& mask, KVCacheBase& cache,
                   const RMSNorm* pre_norm = nullptr) const;
};

// Where a block's RMSNorms sit (each family's checkpoint names):
//   pre (llama): h = x + attn(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h))
//   post (olmo2): h = x + post_attention_layernorm(attn(x));
//                 out = h + post_feedforward_layernorm(mlp(h))
//   sandwich (glm4): h = x + post_self_attn_layernorm(attn(input_layernorm(x)));
//                    out = h + post_mlp_layernorm(mlp(post_attention_layernorm(h)))
enum class NormPlacement { pre, post, sandwich };

struct DecoderOptions {
  int vocab_size = 0;
  int num_hidden_layers = 0;
  int intermediate_size = 0;
  float rms_norm_eps = 1e-5f;
  bool mlp_bias = false;
  bool fused_gate_up = false;  // phi3, glm4: one gate_up_proj
  bool tie_word_embeddings = true;
  NormPlacement norms = NormPlacement::pre;
  // granite: embeddings times embedding_multiplier, each residual branch times
  // residual_multiplier, logits divided by logits_scaling (weak scalars, mlx-lm's Python floats).
  std::optional<double> embedding_multiplier, residual_multiplier, logits_scaling;
  // Per layer, empty = none: sliding-window layers (llama's layer_types, a RotatingKVCache of
  // sliding_window and the windowed mask) and layers without RoPE (smollm3's no_rope_layers).
  std::vector<bool> sliding, no_rope;
  std::optional<int> sliding_window;
  // Whether --tp may split it (mlx-lm's Model.shard exists for the family).
  bool shardable = true;
  AttentionOptions attention;
};

// Arrays of a model by parameter name: pointers into it (full fine-tuning, src/train).
using NamedArrays = std::vector<std::pair<std::string, mx::array*>>;

struct DecoderBlock {
  Attention self_attn;
  SwiGLUMLP mlp;
  NormPlacement norms;
  std::optional<double> residual_multiplier;
  std::optional<RMSNorm> input_layernorm, post_attention_layernorm, post_feedforward_layernorm,
      post_self_attn_layernorm, post_mlp_layernorm;

  DecoderBlock(const DecoderOptions& o, int layer, WeightStore& w, const std::string& path);
  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const;
  // Every array of the block (a quantized Linear's scales and zero points too), named
  // `prefix` + its mlx-lm parameter path.
  NamedArrays parameters(const std::string& prefix);

 private:
  // Tier L3: the layer as two fused CPU primitives around the cached attention
  // (nn/fused_block.cpp); nullopt when a part of it has no fused form.
  std::optional<mx::array> fused(const mx::array& x, const Mask& mask, KVCacheBase& cache) const;
};

// embed_tokens -> blocks -> norm -> lm_head (tied: embed_tokens.as_linear).
class DenseDecoder : public Model {
 public:
  DenseDecoder(const DecoderOptions& o, WeightStore& w);
  mx::array hidden(const mx::array& tokens, Cache& cache) override;
  mx::array operator()(const mx::array& tokens, Cache& cache) override;
  mx::array embed(const mx::array& tokens) const override;
  mx::array head(const mx::array& h) const override;
  Cache make_cache() const override;
  int num_layers() const override { return static_cast<int>(layers_.size()); }
  bool supports_layer_hook() const override { return true; }
  // Full fine-tuning (src/train): layer `layer`'s arrays by mlx-lm parameter name
  // (model.layers.<i>.self_attn.q_proj.weight, ...), pointers into the model that the trainer
  // points at its tracers while it takes a gradient.
  NamedArrays layer_parameters(int layer);

 private:
  bool is_sliding(size_t layer) const { return layer < sliding_.size() && sliding_[layer]; }

  std::optional<double> embedding_multiplier_, logits_scaling_;
  std::vector<bool> sliding_;
  std::optional<int> sliding_window_;
  Embedding embed_tokens_;
  std::vector<DecoderBlock> layers_;
  RMSNorm norm_;
  std::optional<Linear> lm_head_;
};

// (B, L, n_heads * head_dim) -> (B, n_heads, L, head_dim)
mx::array split_heads(const mx::array& x, int n_heads);
// (B, n_heads, L, head_dim) -> (B, L, n_heads * head_dim)
mx::array merge_heads(const mx::array& x);

// The ModelArgs keys llama, qwen2 and qwen3 read alike: sizes, heads (num_key_value_heads
// defaults to the head count unless required), norm eps, vocabulary; checks the head ratio.
DecoderOptions parse_decoder_keys(const JsonView& v, bool kv_heads_required);

// A Python float meeting an array of x's dtype (a weak scalar, rounded to that dtype).
mx::array weak_scalar(double value, const mx::array& x);

// llama.py's layer_types ("full_attention" / "sliding_attention", at least one full layer) as
// DecoderOptions::sliding, with sliding_window required when a layer slides.
void parse_layer_types(const JsonView& v, DecoderOptions& o);

// Drops precomputed rotary tables and, for tied heads, lm_head.weight (mlx-lm sanitize).
void sanitize_dense(Weights& w, bool tie_word_embeddings);

}  // namespace lmx::nn
