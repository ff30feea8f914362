#include "tokenizer/pattern.h"

namespace lmx::tok {

Pattern Pattern::from_node(const Node& node) {
  if (node.has("String")) return literal(node.str("String"));
  if (node.has("Regex")) {
    Pattern p;
    p.literal_ = node.str("Regex");
    try {
      p.regex_.emplace(p.literal_);
    } catch (const Error& e) {
      node.at("Regex").fail(e.what());
    }
    return p;
  }
  node.fail("expected {\"String\": ...} or {\"Regex\": ...}, got ", node.raw().dump());
}

Pattern Pattern::literal(std::string text) {
  Pattern p;
  p.literal_ = std::move(text);
  return p;
}

void Pattern::find_matches(std::string_view s, std::vector<Span>& out) const {
  if (regex_) {
    regex_->find_all(s, out);
    return;
  }
  out.clear();
  if (literal_.empty()) return;
  size_t pos = 0;
  while ((pos = s.find(literal_, pos)) != std::string_view::npos) {
    out.emplace_back(pos, pos + literal_.size());
    pos += literal_.size();
  }
}

std::string Pattern::replace_all(std::string_view s, std::string_view content) const {
  std::vector<Span> matches;
  find_matches(s, matches);
  if (matches.empty()) return std::string(s);
  std::string out;
  out.reserve(s.size());
  size_t last = 0;
  for (auto [b, e] : matches) {
    out.append(s.substr(last, b - last));
    out.append(content);
    last = e;
  }
  out.append(s.substr(last));
  return out;
}

}  // namespace lmx::tok
