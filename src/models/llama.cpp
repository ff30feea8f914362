// Llama (SmolLM2, MiniCPM5, Mistral): mlx_lm/models/llama.py.
#include "nn/transformer.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

// llama.py ModelArgs, with its defaults.
nn::DecoderOptions parse_args(const json& c) {
  JsonView v{c, kSource};
  nn::DecoderOptions o;
  auto& a = o.attention;
  a.hidden_size = v.get<int>("hidden_size");
  o.num_hidden_layers = v.get<int>("num_hidden_layers");
  o.intermediate_size = v.get<int>("intermediate_size");
  a.n_heads = v.get<int>("num_attention_heads");
  o.rms_norm_eps = v.get<float>("rms_norm_eps");
  o.vocab_size = v.get<int>("vocab_size");
  check(a.n_heads > 0, kSource, "num_attention_heads must be > 0, got ", a.n_heads);
  a.head_dim = v.get<int>("head_dim", a.hidden_size / a.n_heads);
  a.n_kv_heads = v.get<int>("num_key_value_heads", a.n_heads);
  check(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, kSource, "num_attention_heads ",
        a.n_heads, " is not a multiple of num_key_value_heads ", a.n_kv_heads);
  a.qkv_bias = a.o_bias = v.get<bool>("attention_bias", false);
  o.mlp_bias = v.get<bool>("mlp_bias", false);
  o.tie_word_embeddings = v.get<bool>("tie_word_embeddings", true);
  a.rope = nn::make_rope(a.head_dim, v.get<float>("rope_theta", 10000.0f),
                         v.get<bool>("rope_traditional", false),
                         v.has("rope_scaling") ? c["rope_scaling"] : json(),
                         v.get_opt<int>("max_position_embeddings"), kSource);
  if (v.has("layer_types")) {
    for (const auto& t : c["layer_types"])
      check(t == "full_attention", kSource, "layer_types entry ", t.dump(),
            " is not supported yet, expected \"full_attention\"");
  }
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
