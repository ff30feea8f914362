// Llama (SmolLM2, MiniCPM5, Mistral): mlx_lm/models/llama.py. layer_types may mark layers
// "sliding_attention": those get a RotatingKVCache of sliding_window and the windowed mask.
#include "nn/transformer.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

// llama.py ModelArgs, with its defaults.
nn::DecoderOptions parse_args(const json& c) {
  JsonView v{c, kSource};
  nn::DecoderOptions o = nn::parse_decoder_keys(v, /*kv_heads_required=*/false);
  auto& a = o.attention;
  a.head_dim = v.get<int>("head_dim", a.hidden_size / a.n_heads);
  a.qkv_bias = a.o_bias = v.get<bool>("attention_bias", false);
  o.mlp_bias = v.get<bool>("mlp_bias", false);
  o.tie_word_embeddings = v.get<bool>("tie_word_embeddings", true);
  a.rope = nn::make_rope(a.head_dim, v.get<float>("rope_theta", 10000.0f),
                         v.get<bool>("rope_traditional", false),
                         v.has("rope_scaling") ? c["rope_scaling"] : json(),
                         v.get_opt<int>("max_position_embeddings"), kSource);
  nn::parse_layer_types(v, o);
  return o;
}

const Architecture kArch{
    [](const json& c, Weights& w) {
      nn::sanitize_dense(w, JsonView{c, kSource}.get<bool>("tie_word_embeddings", true));
    },
    [](const json& c, WeightStore& w) -> std::unique_ptr<Model> {
      return std::make_unique<nn::DenseDecoder>(parse_args(c), w);
    }};

const ArchitectureRegistrar kLlama("llama", kArch);
const ArchitectureRegistrar kMistral("mistral", kArch);

}  // namespace
}  // namespace lmx
