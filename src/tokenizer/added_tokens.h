// tokenizer.json "added_tokens": found in the input before anything else, leftmost-longest, with
// the lstrip/rstrip/single_word options of `tokenizers`' AddedVocabulary. Tokens with
// normalized=false are matched in the raw input, the others in each normalized piece.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"

namespace lmx::tok {

struct AddedToken {
  std::string content;
  int id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool single_word = false;
};

class AddedVocabulary {
 public:
  // A run of input text: an added token (id >= 0) or plain text (id == -1).
  struct Segment {
    size_t begin;
    size_t end;
    int id;
  };

  AddedVocabulary() = default;
  // `normalizer` (may be null) is applied to the contents of normalized tokens, so they are
  // found in normalized text.
  AddedVocabulary(std::vector<AddedToken> tokens, const Normalizer* normalizer);

  // Splits `text` on the raw (normalized=false) or the normalized tokens. Token segments may
  // include the whitespace an lstrip/rstrip token swallows.
  void split(std::string_view text, bool normalized, std::vector<Segment>& out) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool empty() const { return tokens_.empty(); }

 private:
  // Byte trie over token patterns, searched leftmost-longest like aho-corasick's
  // MatchKind::LeftmostLongest.
  class Trie {
   public:
    void add(std::string_view pattern, int token_index);
    bool empty() const { return nodes_.size() <= 1; }
    // Earliest match at or after `from`, the longest one starting there.
    bool find(std::string_view s, size_t from, size_t& begin, size_t& end, int& token) const;

   private:
    struct TrieNode {
      std::vector<std::pair<unsigned char, int>> children;
      int token = -1;
    };
    int child(int node, unsigned char c) const;
    std::vector<TrieNode> nodes_{TrieNode{}};
    std::array<int, 256> root_ = filled_root();  // children of the root, by byte
    static std::array<int, 256> filled_root() {
      std::array<int, 256> r;
      r.fill(-1);
      return r;
    }
  };

  std::vector<AddedToken> tokens_;
  Trie raw_;
  Trie normalized_;
};

}  // namespace lmx::tok
