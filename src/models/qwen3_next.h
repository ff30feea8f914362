// The Qwen3-Next / Qwen3.5 hybrid decoder (mlx_lm/models/qwen3_next.py, qwen3_5.py): every
// full_attention_interval-th layer is gated softmax attention (q_proj doubled into queries and an
// output gate, per-head q/k norms, partial RoPE), the others gated-DeltaNet linear attention over
// an ArraysCache (cache/arrays_cache.h). The MLP is SwiGLU or a sparse MoE with a gated shared
// expert. Shared by the `qwen3_next` registration and the `qwen3_5` / `qwen3_5_moe` ones (whose
// text tensors live under `language_model.`).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/layers.h"

namespace lmx::hybrid {

struct Args {
  int hidden_size = 0, num_hidden_layers = 0, intermediate_size = 0, vocab_size = 0;
  int num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  int linear_num_value_heads = 0, linear_num_key_heads = 0;
  int linear_key_head_dim = 0, linear_value_head_dim = 0, linear_conv_kernel_dim = 0;
  int num_experts = 0, num_experts_per_tok = 0, decoder_sparse_step = 1;
  int shared_expert_intermediate_size = 0, moe_intermediate_size = 0;
  std::vector<int> mlp_only_layers;
  float rms_norm_eps = 1e-6f;
  bool norm_topk_prob = false, tie_word_embeddings = false, attention_bias = false;
  int full_attention_interval = 4;
  nn::RoPE rope;
  // qwen3_5: separate in_proj_qkv / in_proj_z / in_proj_b / in_proj_a (qwen3_next fuses them
  // per key head as in_proj_qkvz and in_proj_ba), and the MoE on every layer when num_experts > 0.
  bool qwen3_5 = false;

  bool is_linear(int layer) const { return (layer + 1) % full_attention_interval != 0; }
  bool is_moe(int layer) const;
};

// Checks shared by both families (head ratios, interval, layer_types against the interval).
void validate(const Args& a, const JsonView& v);

// prefix: "" (qwen3_next) or "language_model." (qwen3_5).
std::unique_ptr<Model> build(const Args& a, WeightStore& w, const std::string& prefix);

// The sanitize steps both families share on Hugging Face checkpoints: conv1d.weight
// (C, 1, K) -> (C, K, 1), and the 1-D norms the checkpoint stores as offsets from 1 (+1).
void move_conv_axis(Weights& w);
void add_one_to_norms(Weights& w);

// mlx-lm's sanitize of each family (what the loader and `lmx convert` run).
void sanitize_qwen3_next(const json& config, Weights& w);
void sanitize_qwen3_5(const json& config, Weights& w);
void sanitize_qwen3_5_moe(const json& config, Weights& w);

}  // namespace lmx::hybrid
