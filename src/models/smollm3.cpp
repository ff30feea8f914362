// SmolLM3 (`smollm3`): mlx_lm/models/smollm3.py. Llama (llama.py's ModelArgs and layer_types)
// with NoPE layers: no_rope_layers[i] == 0 runs layer i without RoPE; absent, every
// no_rope_layer_interval-th layer (1-based) is a NoPE layer.
#include "nn/transformer.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

// smollm3.ModelArgs: llama.ModelArgs plus no_rope_layer_interval / no_rope_layers.
nn::DecoderOptions parse_args(const json& c) {
  JsonView v{c, kSource};
  nn::DecoderOptions o = nn::parse_decoder_keys(v, /*kv_heads_required=*/false);
  auto& a = o.attention;
  a.head_dim = v.get<int>("head_dim", a.hidden_size / a.n_heads);
  a.qkv_bias = a.o_bias = v.get<bool>("attention_bias", false);
  o.mlp_bias = v.get<bool>("mlp_bias", false);
  o.tie_word_embeddings = v.get<bool>("tie_word_embeddings", true);
  o.shardable = false;  // smollm3.py's Model has no shard
  a.rope = nn::make_rope(a.head_dim, v.get<float>("rope_theta", 10000.0f),
                         v.get<bool>("rope_traditional", false),
                         v.has("rope_scaling") ? c["rope_scaling"] : json(),
                         v.get_opt<int>("max_position_embeddings"), kSource);
  nn::parse_layer_types(v, o);
  const int n = o.num_hidden_layers;
  if (v.has("no_rope_layers")) {
    const auto use_rope = v.get<std::vector<int>>("no_rope_layers");
    check(static_cast<int>(use_rope.size()) == n, kSource, "no_rope_layers has ", use_rope.size(),
          " entries, expected num_hidden_layers (", n, ")");
    for (int u : use_rope) o.no_rope.push_back(u == 0);
  } else {
    const int interval = v.get<int>("no_rope_layer_interval", 4);
    check(interval > 0, kSource, "no_rope_layer_interval must be > 0, got ", interval);
    for (int i = 0; i < n; ++i) o.no_rope.push_back((i + 1) % interval == 0);
  }
  return o;
}

const ArchitectureRegistrar kSmolLM3(
    "smollm3",
    {[](const json& c, Weights& w) {
       nn::sanitize_dense(w, JsonView{c, kSource}.get<bool>("tie_word_embeddings", true));
     },
     [](const json& c, WeightStore& w) -> std::unique_ptr<Model> {
       return std::make_unique<nn::DenseDecoder>(parse_args(c), w);
     }});

}  // namespace
}  // namespace lmx
