#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace lmx::tok {

namespace {

// `tokenizers` decides single_word with the regex crate's Unicode \w.
bool is_word_char(std::string_view ch) {
  static const Regex word(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])");
  return word.search(ch);
}

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return is_word_char(s.substr(start));
}

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  return is_word_char(s.substr(0, utf8_seq_len(static_cast<unsigned char>(s[0]))));
}

// Start of the whitespace run that ends `s`.
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t i = start;
    if (!is_whitespace(next_codepoint(s, i))) break;
    end = start;
  }
  return end;
}

// Length of the whitespace run that starts `s`.
size_t leading_space_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t next = i;
    if (!is_whitespace(next_codepoint(s, next))) break;
    i = next;
  }
  return i;
}

}  // namespace

int AddedVocabulary::Trie::child(int node, unsigned char c) const {
  if (node == 0) return root_[c];
  for (const auto& [byte, next] : nodes_[size_t(node)].children) {
    if (byte == c) return next;
  }
  return -1;
}

void AddedVocabulary::Trie::add(std::string_view pattern, int token_index) {
  if (pattern.empty()) return;
  int node = 0;
  for (char ch : pattern) {
    auto c = static_cast<unsigned char>(ch);
    int next = child(node, c);
    if (next < 0) {
      next = int(nodes_.size());
      nodes_[size_t(node)].children.emplace_back(c, next);
      if (node == 0) root_[c] = next;
      nodes_.emplace_back();
    }
    node = next;
  }
  // Two tokens with one pattern: the first added wins, like aho-corasick's pattern order.
  if (nodes_[size_t(node)].token < 0) nodes_[size_t(node)].token = token_index;
}

bool AddedVocabulary::Trie::find(std::string_view s, size_t from, size_t& begin, size_t& end,
                                 int& token) const {
  for (size_t pos = from; pos < s.size(); ++pos) {
    int node = child(0, static_cast<unsigned char>(s[pos]));
    size_t k = pos + 1;
    int best = -1;
    size_t best_end = 0;
    while (node >= 0) {
      if (nodes_[size_t(node)].token >= 0) {
        best = nodes_[size_t(node)].token;
        best_end = k;
      }
      if (k >= s.size()) break;
      node = child(node, static_cast<unsigned char>(s[k++]));
    }
    if (best >= 0) {
      begin = pos;
      end = best_end;
      token = best;
      return true;
    }
  }
  return false;
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens, const Normalizer* normalizer)
    : tokens_(std::move(tokens)) {
  // Special tokens take part in matching before the others (aho-corasick pattern order).
  std::vector<int> order(tokens_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return tokens_[size_t(a)].special && !tokens_[size_t(b)].special;
  });
  for (int index : order) {
    const AddedToken& t = tokens_[size_t(index)];
    if (!t.normalized) {
      raw_.add(t.content, index);
    } else {
      std::string pattern = t.content;
      if (normalizer) normalizer->normalize(pattern);
      normalized_.add(pattern, index);
    }
  }
}

void AddedVocabulary::split(std::string_view text, bool normalized,
                            std::vector<Segment>& out) const {
  out.clear();
  const Trie& trie = normalized ? normalized_ : raw_;
  if (trie.empty() || text.empty()) {
    out.push_back({0, text.size(), -1});
    return;
  }
  size_t start_offset = 0;
  size_t search_from = 0;
  size_t mbegin, mend;
  int index;
  while (trie.find(text, search_from, mbegin, mend, index)) {
    // The next search starts after this match even when it is discarded or widened below.
    search_from = mend;
    const AddedToken& t = tokens_[size_t(index)];
    size_t begin = mbegin, end = mend;
    if (t.single_word) {
      bool space_before = begin == 0 || !ends_with_word(text.substr(0, begin));
      bool space_after = end == text.size() || !starts_with_word(text.substr(end));
      if (!space_before || !space_after) continue;
    }
    if (t.lstrip) begin = std::max(trailing_space_start(text.substr(0, begin)), start_offset);
    if (t.rstrip) end += leading_space_len(text.substr(end));
    if (start_offset < begin) out.push_back({start_offset, begin, -1});
    out.push_back({begin, end, t.id});
    start_offset = end;
  }
  if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
}

}  // namespace lmx::tok
