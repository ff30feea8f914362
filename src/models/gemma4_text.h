// Gemma 4 text model, shared by the `gemma4_text` registration and the multimodal `gemma4`
// wrapper (whose text tensors live under `language_model.`).
#pragma once

#include <memory>
#include <string>

#include "models/model.h"

namespace lmx {

// text_config: gemma4_text's config keys; prefix: "" or "language_model.".
std::unique_ptr<Model> build_gemma4_text(const json& text_config, WeightStore& weights,
                                         const std::string& prefix, const std::string& source);
// gemma4_text.sanitize on keys under `prefix`.
void sanitize_gemma4_text(const json& text_config, Weights& weights);

}  // namespace lmx
