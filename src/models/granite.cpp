// Granite (`granite`): mlx_lm/models/granite.py. Llama's block with muP-style multipliers:
// embeddings times embedding_multiplier, each residual branch times residual_multiplier,
// attention scaled by attention_multiplier (instead of head_dim^-0.5), logits divided by
// logits_scaling; head_dim = hidden / heads, never a traditional RoPE. mlx-lm requires every
// one of these keys.
#include "nn/transformer.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

// granite.ModelArgs: everything but rope_scaling and tie_word_embeddings is required.
nn::DecoderOptions parse_args(const json& c) {
  JsonView v{c, kSource};
  nn::DecoderOptions o = nn::parse_decoder_keys(v, /*kv_heads_required=*/true);
  auto& a = o.attention;
  a.head_dim = a.hidden_size / a.n_heads;
  o.logits_scaling = v.get<double>("logits_scaling");
  a.scale = v.get<float>("attention_multiplier");
  o.embedding_multiplier = v.get<double>("embedding_multiplier");
  o.residual_multiplier = v.get<double>("residual_multiplier");
  const int max_pos = v.get<int>("max_position_embeddings");
  a.qkv_bias = a.o_bias = v.get<bool>("attention_bias");
  o.mlp_bias = v.get<bool>("mlp_bias");
  o.tie_word_embeddings = v.get<bool>("tie_word_embeddings", true);
  o.shardable = false;  // granite.py has no Model.shard
  a.rope = nn::make_rope(a.head_dim, v.get<float>("rope_theta"), false,
                         v.has("rope_scaling") ? c["rope_scaling"] : json(), max_pos, kSource);
  return o;
}

const ArchitectureRegistrar kGranite(
    "granite", {[](const json& c, Weights& w) {
                  if (JsonView{c, kSource}.get<bool>("tie_word_embeddings", true))
                    w.erase("lm_head.weight");
                },
                [](const json& c, WeightStore& w) -> std::unique_ptr<Model> {
                  return std::make_unique<nn::DenseDecoder>(parse_args(c), w);
                }});

}  // namespace
}  // namespace lmx
