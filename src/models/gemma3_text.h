// Gemma 3 text model, shared by the `gemma3_text` registration and the multimodal `gemma3`
// wrapper (whose text tensors live under `language_model.`).
#pragma once

#include <memory>
#include <string>

#include "models/model.h"

namespace lmx {

// text_config: gemma3_text's config keys; prefix: "" or "language_model.".
std::unique_ptr<Model> build_gemma3_text(const json& text_config, WeightStore& weights,
                                         const std::string& prefix, const std::string& source);

}  // namespace lmx
