// tokenizer.json "normalizer": rewrites each piece of input text (between added tokens) before
// pre-tokenization. Supported: NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, Strip, Prepend,
// Replace and Sequence.
#pragma once

#include <memory>
#include <string>

#include "tokenizer/json_node.h"

namespace lmx::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `s` is valid UTF-8 and stays so.
  virtual void normalize(std::string& s) const = 0;
};

// Null for a null/absent node.
std::unique_ptr<Normalizer> make_normalizer(const Node& node);

}  // namespace lmx::tok
