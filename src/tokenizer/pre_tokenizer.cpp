#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <utility>

#include "tokenizer/pattern.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace lmx::tok {

// ------------------------------------------------------------------------------------------------
// Byte-level alphabet

namespace {

struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::array<int, 324> to_byte{};  // every mapped character is below U+0144

  ByteTables() {
    to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      char32_t cp = printable ? char32_t(b) : char32_t(256 + extra++);
      append_utf8(to_unicode[b], cp);
      to_byte[cp] = b;
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}

}  // namespace

const std::array<std::string, 256>& byte_to_unicode() { return byte_tables().to_unicode; }

int unicode_to_byte(char32_t cp) {
  const auto& t = byte_tables().to_byte;
  return cp < t.size() ? t[cp] : -1;
}

void append_byte_level(std::string_view text, std::string& out) {
  const auto& table = byte_tables().to_unicode;
  for (char c : text) out.append(table[static_cast<unsigned char>(c)]);
}

// ------------------------------------------------------------------------------------------------
// Splitting with `tokenizers`' SplitDelimiterBehavior

namespace {

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const Node& node) {
  std::string b = node.as_string();
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  node.fail("expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous, got \"",
            b, "\"");
}

struct Part {
  Span span;
  bool flag;  // is_match on input, "remove" after applying the behaviour
};

// Splits `piece` at `matches` (sorted, non-overlapping) the way NormalizedString::split does,
// appending the non-empty results to `out`.
void split_piece(PreToken&& piece, const std::vector<Span>& matches, Behavior behavior, bool invert,
                 std::vector<PreToken>& out) {
  const std::string& s = piece.text;
  if (s.empty()) return;
  if (matches.empty() && !(behavior == Behavior::Removed && invert)) {
    // Nothing matched: the whole piece is a single non-match, kept by every behaviour except
    // an inverted Removed (where non-matches are what gets removed).
    out.push_back(std::move(piece));
    return;
  }
  std::vector<Part> parts;
  parts.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev != b) parts.push_back({{prev, b}, invert});
    parts.push_back({{b, e}, !invert});
    prev = e;
  }
  if (prev != s.size()) parts.push_back({{prev, s.size()}, invert});

  std::vector<Part> result;
  result.reserve(parts.size());
  switch (behavior) {
    case Behavior::Isolated:
      for (auto& p : parts) result.push_back({p.span, false});
      break;
    case Behavior::Removed:
      result = parts;
      break;
    case Behavior::Contiguous: {
      bool prev_match = false;
      for (auto& p : parts) {
        if (p.flag == prev_match && !result.empty()) {
          result.back().span.second = p.span.second;
        } else {
          result.push_back({p.span, false});
        }
        prev_match = p.flag;
      }
      break;
    }
    case Behavior::MergedWithPrevious: {
      bool prev_match = false;
      for (auto& p : parts) {
        if (p.flag && !prev_match && !result.empty()) {
          result.back().span.second = p.span.second;
        } else {
          result.push_back({p.span, false});
        }
        prev_match = p.flag;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool prev_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->flag && !prev_match && !result.empty()) {
          result.back().span.first = it->span.first;
        } else {
          result.push_back({it->span, false});
        }
        prev_match = it->flag;
      }
      std::reverse(result.begin(), result.end());
      break;
    }
  }
  for (auto& r : result) {
    if (r.flag || r.span.first == r.span.second) continue;
    out.push_back({s.substr(r.span.first, r.span.second - r.span.first),
                   piece.at_start && r.span.first == 0});
  }
}

// Applies `fn(PreToken&&, std::vector<PreToken>& out)` to every piece.
template <typename Fn>
void for_each_piece(std::vector<PreToken>& pieces, Fn&& fn) {
  std::vector<PreToken> out;
  out.reserve(pieces.size() * 2);
  for (auto& p : pieces) fn(std::move(p), out);
  pieces = std::move(out);
}

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {
    if (use_regex_) regex_.emplace(kGpt2Pattern);
  }
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    std::vector<Span> matches;
    for_each_piece(pieces, [&](PreToken&& p, std::vector<PreToken>& out) {
      if (add_prefix_space_ && !p.text.empty() && p.text[0] != ' ') {
        p.text.insert(p.text.begin(), ' ');
      }
      size_t first = out.size();
      if (use_regex_) {
        regex_->find_all(p.text, matches);
        split_piece(std::move(p), matches, Behavior::Isolated, false, out);
      } else if (!p.text.empty()) {
        out.push_back(std::move(p));
      }
      std::string mapped;
      for (size_t i = first; i < out.size(); ++i) {
        mapped.clear();
        append_byte_level(out[i].text, mapped);
        out[i].text.swap(mapped);
      }
    });
  }

 private:
  bool add_prefix_space_, use_regex_;
  std::optional<Regex> regex_;
};

class Split final : public PreTokenizer {
 public:
  Split(Pattern pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    std::vector<Span> matches;
    for_each_piece(pieces, [&](PreToken&& p, std::vector<PreToken>& out) {
      pattern_.find_matches(p.text, matches);
      split_piece(std::move(p), matches, behavior_, invert_, out);
    });
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

class Digits final : public PreTokenizer {
 public:
  explicit Digits(bool individual) : individual_(individual) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    std::vector<Span> matches;
    for_each_piece(pieces, [&](PreToken&& p, std::vector<PreToken>& out) {
      matches.clear();
      size_t i = 0;
      while (i < p.text.size()) {
        size_t start = i;
        if (is_numeric(next_codepoint(p.text, i))) matches.emplace_back(start, i);
      }
      split_piece(std::move(p), matches, individual_ ? Behavior::Isolated : Behavior::Contiguous,
                  false, out);
    });
  }

 private:
  bool individual_;
};

class Metaspace final : public PreTokenizer {
 public:
  enum class Prepend { Always, First, Never };
  Metaspace(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(split) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    std::vector<Span> matches;
    for_each_piece(pieces, [&](PreToken&& p, std::vector<PreToken>& out) {
      std::string s;
      s.reserve(p.text.size() + replacement_.size());
      for (char c : p.text) {
        if (c == ' ') {
          s.append(replacement_);
        } else {
          s.push_back(c);
        }
      }
      bool starts = s.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (prepend_ == Prepend::Always || (prepend_ == Prepend::First && p.at_start))) {
        s.insert(0, replacement_);
      }
      p.text = std::move(s);
      if (!split_) {
        if (!p.text.empty()) out.push_back(std::move(p));
        return;
      }
      matches.clear();
      size_t pos = 0;
      while ((pos = p.text.find(replacement_, pos)) != std::string::npos) {
        matches.emplace_back(pos, pos + replacement_.size());
        pos += replacement_.size();
      }
      split_piece(std::move(p), matches, Behavior::MergedWithNext, false, out);
    });
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (const auto& step : steps_) step->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

std::string single_char(const Node& node) {
  std::string s = node.as_string();
  if (s.empty() || utf8_seq_len(static_cast<unsigned char>(s[0])) != s.size()) {
    node.fail("expected a single character, got \"", s, "\"");
  }
  return s;
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Node& node) {
  if (node.is_null()) return nullptr;
  std::string type = node.type();
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevel>(node.boolean("add_prefix_space", true),
                                       node.boolean("use_regex", true));
  }
  if (type == "Split") {
    return std::make_unique<Split>(Pattern::from_node(node.at("pattern")),
                                   parse_behavior(node.at("behavior")),
                                   node.boolean("invert", false));
  }
  if (type == "Digits") return std::make_unique<Digits>(node.boolean("individual_digits", false));
  if (type == "Metaspace") {
    std::string replacement =
        node.has("replacement") ? single_char(node.at("replacement")) : std::string("\xE2\x96\x81");
    Metaspace::Prepend prepend = node.boolean("add_prefix_space", true) ? Metaspace::Prepend::Always
                                                                        : Metaspace::Prepend::Never;
    if (node.has("prepend_scheme")) {
      std::string scheme = node.str("prepend_scheme");
      if (scheme == "always") {
        prepend = Metaspace::Prepend::Always;
      } else if (scheme == "first") {
        prepend = Metaspace::Prepend::First;
      } else if (scheme == "never") {
        prepend = Metaspace::Prepend::Never;
      } else {
        node.at("prepend_scheme").fail("expected always, first or never, got \"", scheme, "\"");
      }
    }
    return std::make_unique<Metaspace>(replacement, prepend, node.boolean("split", true));
  }
  if (type == "Sequence") {
    Node list = node.at("pretokenizers");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      if (auto p = make_pre_tokenizer(list[i])) steps.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  node.unsupported("ByteLevel, Split, Digits, Metaspace, Sequence");
}

}  // namespace lmx::tok
