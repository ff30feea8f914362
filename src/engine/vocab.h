// What the loaded config and the tokenizer together say about the vocabulary, shared by the
// public LanguageModel and the server's engine.
#pragma once

#include <vector>

#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace lmx {

// mlx-lm's TokenizerWrapper: the config's eos ids, then the tokenizer's own eos tokens.
std::vector<int> merged_eos_ids(const ModelInfo& info, const Tokenizer& tokenizer);
// config.json's vocab_size (the logits' width), else the tokenizer's.
int model_vocab_size(const ModelInfo& info, const Tokenizer& tokenizer);

}  // namespace lmx
