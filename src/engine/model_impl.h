// What LanguageModel holds, shared by the engine's files (language_model.cpp, session.cpp).
#pragma once

#include <vector>

#include "lmx/lmx.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace lmx {

struct LanguageModel::Impl {
  LoadedWeights loaded;
  Tokenizer tokenizer;
  std::vector<int> eos;
};

// Throws lmx::Error for an empty prompt, one longer than the context, ids outside the vocabulary
// or invalid sampler options.
void validate_request(const LanguageModel& model, const std::vector<int>& prompt,
                      const GenerateOptions& options);

// Generates from `prompt` continuing `cache`, streaming detokenized text; appends every sampled
// token that reached `on_token` to `generated` when given.
GenerationStats stream_generate(LanguageModel::Impl& impl, Cache& cache,
                                const std::vector<int>& prompt, const GenerateOptions& options,
                                const std::function<bool(const TokenOutput&)>& on_token,
                                std::vector<int>* generated);

}  // namespace lmx
