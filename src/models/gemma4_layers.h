// Gemma 4 text building blocks, in the order of mlx_lm/models/gemma4_text.py: ModelArgs
// (gemma4_args.cpp, with sanitize), then MLP, Router, attention with KV sharing and one decoder
// layer (gemma4_layers.cpp); gemma4_text.cpp assembles the model.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/model.h"
#include "nn/switch_layers.h"
#include "nn/transformer.h"

namespace lmx::gemma4 {

struct Args {
  int hidden_size, num_hidden_layers, intermediate_size, num_attention_heads, head_dim;
  int global_head_dim;  // 0: head_dim
  float rms_norm_eps;
  int vocab_size, vocab_size_per_layer_input, num_key_value_heads;
  std::optional<int> num_global_key_value_heads;
  int num_kv_shared_layers, hidden_size_per_layer_input;  // 0: no per-layer inputs
  bool rope_traditional;
  json rope_parameters;
  int sliding_window, sliding_window_pattern, max_position_embeddings;
  bool attention_k_eq_v;
  std::optional<double> final_logit_softcapping;
  bool use_double_wide_mlp, enable_moe_block;
  int num_experts = 0, top_k_experts = 0, moe_intermediate_size = 0;
  std::vector<std::string> layer_types;
  bool tie_word_embeddings;

  int first_kv_shared() const { return num_hidden_layers - num_kv_shared_layers; }
  bool is_sliding(int i) const { return layer_types[i] == "sliding_attention"; }
};

// gemma4_text.ModelArgs with its defaults (and __post_init__).
Args parse_args(const json& c, const std::string& source);

// A Python float meeting an array of x's dtype (weak scalar).
mx::array weak(double value, const mx::array& x);

struct MLP {
  nn::Linear gate_proj, up_proj, down_proj;
  static MLP load(WeightStore& w, const std::string& p, int dims, int hidden);
  mx::array operator()(const mx::array& x) const;
};

// Router: rms_norm with scale * hidden^-0.5, project, top-k, softmax (not precise) over the
// chosen scores, times per_expert_scale. Returns (expert indices, weights), (B, L, top_k).
struct Router {
  nn::Linear proj;
  mx::array scale, per_expert_scale;
  float eps;
  int top_k;
  double root_size;
  std::pair<mx::array, mx::array> operator()(const mx::array& x) const;
};

// What a donor layer hands to the layers sharing its K/V: the keys/values its cache returned
// (plain, or quantized with the cache's settings) and its RoPE offset.
struct SharedKV {
  std::optional<std::pair<mx::array, mx::array>> plain;
  std::optional<std::pair<QuantizedArray, QuantizedArray>> quantized;
  KVQuantization quant;
  mx::array offset{0};
};

struct Attention {
  bool has_kv, use_k_eq_v;
  int n_heads, n_kv_heads, head_dim;
  float eps;
  nn::Linear q_proj, o_proj;
  std::optional<nn::Linear> k_proj, v_proj;
  nn::RMSNorm q_norm;
  std::optional<nn::RMSNorm> k_norm;
  nn::RoPE rope;

  Attention(const Args& a, int i, WeightStore& w, const std::string& p, const std::string& source);
  // cache: the layer's own cache (donors), nullptr for KV-shared layers, which get `shared`.
  std::pair<mx::array, SharedKV> operator()(const mx::array& x, const Mask& mask,
                                            KVCacheBase* cache, const SharedKV* shared) const;
};

// The MoE block beside the dense MLP: router, experts through SwitchGLU, and its norms.
struct MoE {
  Router router;
  nn::SwitchGLU experts;
  nn::RMSNorm post_feedforward_layernorm_1, post_feedforward_layernorm_2,
      pre_feedforward_layernorm_2;
};

// Per-layer input embeddings (E2B/E4B): gate, projection back to hidden, norm.
struct PerLayerInput {
  nn::Linear per_layer_input_gate, per_layer_projection;
  nn::RMSNorm post_per_layer_input_norm;
};

struct DecoderLayer {
  Attention self_attn;
  MLP mlp;
  nn::RMSNorm input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
      post_feedforward_layernorm;
  std::optional<MoE> moe;
  std::optional<PerLayerInput> per_layer;
  mx::array layer_scalar;

  DecoderLayer(const Args& a, int i, WeightStore& w, const std::string& p,
               const std::string& source);
  // x (B, L, hidden); per_layer_input (B, L, hidden_size_per_layer_input) when the model has
  // per-layer inputs. Returns the layer output and the K/V for layers sharing this one's.
  std::pair<mx::array, SharedKV> operator()(const mx::array& x, const Mask& mask,
                                            KVCacheBase* cache,
                                            const std::optional<mx::array>& per_layer_input,
                                            const SharedKV* shared) const;
};

}  // namespace lmx::gemma4
