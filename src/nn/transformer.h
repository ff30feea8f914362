// The pre-norm dense decoder that llama, qwen2 and qwen3 share (mlx-lm's llama.py shape): the
// families differ only in projection biases, q/k norms and RoPE, which the options carry.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "nn/layers.h"

namespace lmx::nn {

// mlx-lm MLP: down(swiglu(gate(x), up(x))).
struct SwiGLUMLP {
  Linear gate_proj, up_proj, down_proj;

  static SwiGLUMLP load(WeightStore& w, const std::string& path, int dims, int hidden, bool bias);
  mx::array operator()(const mx::array& x) const;
};

struct AttentionOptions {
  int hidden_size = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  bool qkv_bias = false;
  bool o_bias = false;
  std::optional<float> qk_norm_eps;  // qwen3: RMSNorm over head_dim before RoPE
  RoPE rope;
};

struct Attention {
  AttentionOptions opt;
  float scale;
  Linear q_proj, k_proj, v_proj, o_proj;
  std::optional<RMSNorm> q_norm, k_norm;

  Attention(const AttentionOptions& o, WeightStore& w, const std::string& path);
  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const;
};

struct DecoderOptions {
  int vocab_size = 0;
  int num_hidden_layers = 0;
  int intermediate_size = 0;
  float rms_norm_eps = 1e-5f;
  bool mlp_bias = false;
  bool tie_word_embeddings = true;
  AttentionOptions attention;
};

struct DecoderBlock {
  Attention self_attn;
  SwiGLUMLP mlp;
  RMSNorm input_layernorm, post_attention_layernorm;

  DecoderBlock(const DecoderOptions& o, WeightStore& w, const std::string& path);
  mx::array operator()(const mx::array& x, const Mask& mask, KVCacheBase& cache) const;

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
  int num_layers() const override { return static_cast<int>(layers_.size()); }

 private:
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

// Drops precomputed rotary tables and, for tied heads, lm_head.weight (mlx-lm sanitize).
void sanitize_dense(Weights& w, bool tie_word_embeddings);

}  // namespace lmx::nn
