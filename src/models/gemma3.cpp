// Gemma 3 multimodal wrapper (`gemma3`): mlx_lm/models/gemma3.py. Only the text model runs: its
// config is `text_config` (vocab_size from the top level, 8 / 4 heads when absent), its tensors
// are under `language_model.`, and sanitize drops the vision tower and projector.
#include "models/gemma3_text.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

void sanitize(const json&, Weights& w) {
  std::erase_if(w, [](const auto& kv) {
    return kv.first.starts_with("vision_tower.") || kv.first.starts_with("multi_modal_projector.");
  });
}

std::unique_ptr<Model> build(const json& c, WeightStore& w) {
  JsonView v{c, kSource};
  check(v.has("text_config") && c["text_config"].is_object(), kSource,
        "missing required key 'text_config' (an object)");
  json text = c["text_config"];
  text["vocab_size"] = v.get<int>("vocab_size", 262208);
  if (!text.contains("num_attention_heads")) text["num_attention_heads"] = 8;
  if (!text.contains("num_key_value_heads")) text["num_key_value_heads"] = 4;
  return build_gemma3_text(text, w, "language_model.", std::string(kSource) + " text_config");
}

const ArchitectureRegistrar kGemma3("gemma3", {sanitize, build});

}  // namespace
}  // namespace lmx
