// Gemma 4 multimodal wrapper (`gemma4`, and `gemma4_unified` which mlx-lm maps to it):
// mlx_lm/models/gemma4.py. Only the text model runs: its config is `text_config` (vocab_size from
// the top level, 8 heads / 1 KV head when absent); Hugging Face keys `model.language_model.*`
// become `language_model.model.*`, vision / audio tensors are dropped, then gemma4_text's
// sanitize applies.
#include "models/gemma4_text.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

json text_config(const json& c) {
  JsonView v{c, kSource};
  json text = v.has("text_config") ? c["text_config"] : json::object();
  check(text.is_object(), kSource, "'text_config' must be an object");
  text["vocab_size"] = v.get<int>("vocab_size", 262144);
  if (!text.contains("num_attention_heads")) text["num_attention_heads"] = 8;
  if (!text.contains("num_key_value_heads")) text["num_key_value_heads"] = 1;
  return text;
}

void sanitize(const json& c, Weights& w) {
  Weights out;
  for (auto& [key, t] : w) {
    const bool from_model = key.starts_with("model.");
    std::string k = from_model ? key.substr(6) : key;
    bool drop = false;
    for (const char* p : {"vision_tower", "multi_modal_projector", "audio_tower", "embed_audio",
                          "embed_vision", "vision_embedder"})
      drop = drop || k.starts_with(p);
    if (drop) continue;
    if (from_model && k.starts_with("language_model")) {
      // str.replace: every occurrence.
      for (size_t at = k.find("language_model."); at != std::string::npos;
           at = k.find("language_model.", at + 21))
        k.replace(at, 15, "language_model.model.");
    }
    out.insert_or_assign(k, t);
  }
  w = std::move(out);
  sanitize_gemma4_text(text_config(c), w);
}

std::unique_ptr<Model> build(const json& c, WeightStore& w) {
  return build_gemma4_text(text_config(c), w, "language_model.",
                           std::string(kSource) + " text_config");
}

const ArchitectureRegistrar kGemma4("gemma4", {sanitize, build});
const ArchitectureRegistrar kGemma4Unified("gemma4_unified", {sanitize, build});

}  // namespace
}  // namespace lmx
