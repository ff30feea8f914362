// Qwen3 (and Qwen3-Embedding): mlx_lm/models/qwen3.py. Per-head RMSNorm on q and k before RoPE;
// head_dim is explicit and independent of hidden_size / heads.
#include "nn/transformer.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

nn::DecoderOptions parse_args(const json& c) {
  JsonView v{c, kSource};
  nn::DecoderOptions o = nn::parse_decoder_keys(v, /*kv_heads_required=*/true);
  auto& a = o.attention;
  const int max_pos = v.get<int>("max_position_embeddings");
  a.head_dim = v.get<int>("head_dim");
  o.tie_word_embeddings = v.get<bool>("tie_word_embeddings");
  a.qk_norm_eps = o.rms_norm_eps;
  // transformers >= 5 nests rope_theta and rope_scaling under rope_parameters.
  std::optional<float> theta = v.get_opt<float>("rope_theta");
  json scaling = v.has("rope_scaling") ? c["rope_scaling"] : json();
  if (v.has("rope_parameters") && c["rope_parameters"].is_object()) {
    const json& rp = c["rope_parameters"];
    if (!theta && rp.contains("rope_theta")) theta = rp["rope_theta"].get<float>();
    if (scaling.is_null()) scaling = rp;
  }
  check(theta.has_value(), kSource, "rope_theta is missing from the model config");
  a.rope = nn::make_rope(a.head_dim, *theta, false, scaling, max_pos, kSource);
  return o;
}

// Qwen3-Embedding checkpoints are saved as transformers' Qwen3Model (the body alone): its keys
// lack the "model." prefix of Qwen3ForCausalLM.
void add_model_prefix(Weights& w) {
  if (w.count("model.embed_tokens.weight") || !w.count("embed_tokens.weight")) return;
  Weights out;
  for (auto& [k, v] : w) out.emplace(k.rfind("lm_head.", 0) == 0 ? k : "model." + k, v);
  w = std::move(out);
}

const ArchitectureRegistrar kQwen3("qwen3",
                                   {[](const json& c, Weights& w) {
                                      add_model_prefix(w);
                                      if (JsonView{c, kSource}.get<bool>("tie_word_embeddings"))
                                        w.erase("lm_head.weight");
                                    },
                                    [](const json& c, WeightStore& w) -> std::unique_ptr<Model> {
                                      return std::make_unique<nn::DenseDecoder>(parse_args(c), w);
                                    }});

}  // namespace
}  // namespace lmx
