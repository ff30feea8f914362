// OLMo 2 (`olmo2`): mlx_lm/models/olmo2.py. Llama's attention and MLP with the norms after the
// sublayers (post_attention_layernorm on the attention output, post_feedforward_layernorm on the
// MLP output, no input norm) and q/k RMSNorms over the whole projection, before the heads split.
#include "nn/transformer.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

// olmo2.ModelArgs, with its defaults (llama's).
nn::DecoderOptions parse_args(const json& c) {
  JsonView v{c, kSource};
  nn::DecoderOptions o = nn::parse_decoder_keys(v, /*kv_heads_required=*/false);
  auto& a = o.attention;
  a.head_dim = v.get<int>("head_dim", a.hidden_size / a.n_heads);
  a.qkv_bias = a.o_bias = v.get<bool>("attention_bias", false);
  a.qk_norm_eps = o.rms_norm_eps;
  a.qk_norm_over_projection = true;
  o.mlp_bias = v.get<bool>("mlp_bias", false);
  o.tie_word_embeddings = v.get<bool>("tie_word_embeddings", true);
  o.norms = nn::NormPlacement::post;
  o.shardable = false;  // olmo2.py has no Model.shard
  a.rope = nn::make_rope(a.head_dim, v.get<float>("rope_theta", 10000.0f),
                         v.get<bool>("rope_traditional", false),
                         v.has("rope_scaling") ? c["rope_scaling"] : json(),
                         v.get_opt<int>("max_position_embeddings"), kSource);
  return o;
}

std::unique_ptr<Model> build(const json& c, WeightStore& w) {
  return std::make_unique<nn::DenseDecoder>(parse_args(c), w);
}

// olmo2.sanitize drops the precomputed rotary frequencies only: a tied config with an
// lm_head.weight tensor is an error.
void sanitize(const json&, Weights& w) {
  std::erase_if(w, [](const auto& kv) {
    return kv.first.find("self_attn.rotary_emb.inv_freq") != std::string::npos;
  });
}

const ArchitectureRegistrar kOlmo2("olmo2", {sanitize, build});

}  // namespace
}  // namespace lmx
