// Qwen2: mlx_lm/models/qwen2.py. Llama's block with q/k/v biases and no o_proj bias.
#include "nn/transformer.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

// qwen2.py ModelArgs, with its defaults; head_dim is always hidden_size / heads.
nn::DecoderOptions parse_args(const json& c) {
  JsonView v{c, kSource};
  nn::DecoderOptions o = nn::parse_decoder_keys(v, /*kv_heads_required=*/true);
  auto& a = o.attention;
  a.head_dim = a.hidden_size / a.n_heads;
  a.qkv_bias = true;
  a.o_bias = false;
  o.tie_word_embeddings = v.get<bool>("tie_word_embeddings", true);
  a.rope = nn::make_rope(a.head_dim, v.get<float>("rope_theta", 1000000.0f),
                         v.get<bool>("rope_traditional", false),
                         v.has("rope_scaling") ? c["rope_scaling"] : json(),
                         v.get<int>("max_position_embeddings", 32768), kSource);
  return o;
}

const ArchitectureRegistrar kQwen2(
    "qwen2", {[](const json& c, Weights& w) {
                nn::sanitize_dense(w, JsonView{c, kSource}.get<bool>("tie_word_embeddings", true));
              },
              [](const json& c, WeightStore& w) -> std::unique_ptr<Model> {
                return std::make_unique<nn::DenseDecoder>(parse_args(c), w);
              }});

}  // namespace
}  // namespace lmx
