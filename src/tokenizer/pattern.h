// The {"String": ...} / {"Regex": ...} patterns of Split, Replace (normalizer and decoder).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/json_node.h"
#include "tokenizer/regex.h"

namespace lmx::tok {

using Span = std::pair<size_t, size_t>;  // [begin, end) byte offsets

class Pattern {
 public:
  static Pattern from_node(const Node& node);
  static Pattern literal(std::string text);

  // Non-overlapping matches, left to right. An empty literal never matches.
  void find_matches(std::string_view s, std::vector<Span>& out) const;
  std::string replace_all(std::string_view s, std::string_view content) const;

  bool is_literal() const { return !regex_.has_value(); }
  const std::string& literal_text() const { return literal_; }

 private:
  std::string literal_;
  std::optional<Regex> regex_;
};

}  // namespace lmx::tok
