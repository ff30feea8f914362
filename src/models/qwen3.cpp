// Qwen3 (and Qwen3-Embedding): mlx_lm/models/qwen3.py. Per-head RMSNorm on q and k before RoPE;
// head_dim is explicit and independent of hidden_size / heads.
#include "nn/rope_config.h"
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
  a.rope = nn::rope_from_config(v, a.head_dim, max_pos);
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
