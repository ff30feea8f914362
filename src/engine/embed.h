// Qwen3-Embedding pooling: the final norm's state at the last position (the appended end-of-text
// token), cast to float32 and divided by its L2 norm.
#pragma once

#include <string_view>
#include <vector>

#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace lmx {

// ids: one sequence (already ending in the end-of-text token) -> (hidden,) float32, unit norm.
// A fresh cache per call; each sequence runs alone (batch 1), so the result never depends on
// what else is embedded with it.
mx::array embed_sequence(Model& model, const std::vector<int>& ids);

// `text`'s ids with the end-of-text token (<|endoftext|>, else the tokenizer's eos token)
// appended unless the tokenizer already ended with it.
std::vector<int> embedding_tokens(const Tokenizer& tok, std::string_view text);

}  // namespace lmx
