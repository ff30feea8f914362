// tokenizer.json / tokenizer_config.json / generation_config.json rebuilt from a GGUF's
// `tokenizer.ggml.*` metadata, the way transformers' GGUF tokenizer conversion builds them
// (integrations/gguf/gguf_tokenizer_mapping.py): byte-level BPE for `gpt2`, SentencePiece BPE with
// byte fallback for `llama` (Gemma's variant for gemma* architectures).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "convert/mlx_writer.h"
#include "io/gguf.h"

namespace lmx::convert {

struct GgufTokenizer {
  std::string tokenizer_json;  // serialized tokenizer.json
  ojson tokenizer_config;
  ojson generation_config;
  int64_t vocab_size = 0;
  std::optional<int64_t> bos_id, eos_id, pad_id;
  // End-of-generation ids: eos, eot/eom ids, and control tokens named like llama.cpp's EOG
  // tokens (<|im_end|>, <end_of_turn>, <|eot_id|>, ...), so generation stops at the end of a turn.
  std::vector<int64_t> eos_ids;
};

// `arch` is general.architecture; `model_max_length` goes to tokenizer_config.json.
GgufTokenizer build_gguf_tokenizer(const gguf::File& file, const std::string& arch,
                                   int64_t model_max_length);

// Writes tokenizer.json, tokenizer_config.json and generation_config.json into `dir`.
void write_gguf_tokenizer(const GgufTokenizer& tok, const std::filesystem::path& dir);

// transformers `generate_merges`: every split of every token into two vocabulary pieces, sorted
// best-first by (score, len(left), len(right)) descending, stably. `scores[i]` belongs to
// tokens[i]; for duplicate tokens the last one's score and id count (Python dict semantics).
std::vector<std::pair<std::string, std::string>> generate_merges(
    const std::vector<std::string>& tokens, const std::vector<double>& scores);

}  // namespace lmx::convert
