// tokenizer.json "pre_tokenizer": splits normalized text into the words the model encodes one by
// one. Supported: ByteLevel, Split, Digits, Metaspace, Sequence.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/json_node.h"

namespace lmx::tok {

struct PreToken {
  std::string text;
  // Starts at offset 0 of the original input: Metaspace's prepend_scheme "first" only prefixes
  // such a piece.
  bool at_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits every piece further (dropping empty results) and may rewrite their text.
  virtual void pre_tokenize(std::vector<PreToken>& pieces) const = 0;
};

// Null for a null/absent node.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Node& node);

// GPT-2's reversible byte <-> printable character mapping used by ByteLevel pieces.
const std::array<std::string, 256>& byte_to_unicode();
// Maps a byte-level character back to its byte; -1 for characters outside the mapping.
int unicode_to_byte(char32_t cp);
// Appends the byte-level spelling of `text` (every byte mapped to its character).
void append_byte_level(std::string_view text, std::string& out);

}  // namespace lmx::tok
