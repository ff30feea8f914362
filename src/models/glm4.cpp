// GLM-4 (`glm4`, GLM-4-0414): mlx_lm/models/glm4.py. Sandwich norms (input_layernorm and
// post_self_attn_layernorm around attention, post_attention_layernorm and post_mlp_layernorm
// around the MLP), one gate_up_proj, q/k/v biases (attention_bias) without an o_proj bias, RoPE
// over partial_rotary_factor of the head (traditional by default), an untied head always.
#include "nn/transformer.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

// glm4.ModelArgs: all keys required but rope_traditional and max_position_embeddings.
nn::DecoderOptions parse_args(const json& c) {
  JsonView v{c, kSource};
  nn::DecoderOptions o = nn::parse_decoder_keys(v, /*kv_heads_required=*/true);
  auto& a = o.attention;
  a.qkv_bias = v.get<bool>("attention_bias");
  a.head_dim = v.get<int>("head_dim");
  const double partial = v.get<double>("partial_rotary_factor");
  a.rope = nn::make_rope(static_cast<int>(a.head_dim * partial), v.get<float>("rope_theta"),
                         v.get<bool>("rope_traditional", true), json(), std::nullopt, kSource);
  o.fused_gate_up = true;
  o.norms = nn::NormPlacement::sandwich;
  o.tie_word_embeddings = false;
  o.shardable = false;  // glm4.py has no Model.shard
  return o;
}

std::unique_ptr<Model> build(const json& c, WeightStore& w) {
  return std::make_unique<nn::DenseDecoder>(parse_args(c), w);
}

// No sanitize, as in mlx-lm.
const ArchitectureRegistrar kGlm4("glm4", {nullptr, build});

}  // namespace
}  // namespace lmx
