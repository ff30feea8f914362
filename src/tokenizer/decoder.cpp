#include "tokenizer/decoder.h"

#include <algorithm>

#include "tokenizer/pattern.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"

namespace lmx::tok {

namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

// Builds a stage state type from its step's configuration.
template <typename State, typename Config>
class Step final : public DecoderStep {
 public:
  explicit Step(Config config) : config_(std::move(config)) {}
  std::unique_ptr<DecodeSink> start(DecodeSink* next) const override {
    return std::make_unique<State>(config_, next);
  }

 private:
  Config config_;
};

// ------------------------------------------------------------------------------------------------
// ByteLevel: every token maps back to bytes (a token with a character outside the byte alphabet,
// such as an added token, contributes its own UTF-8); all bytes then become one string through a
// lossy UTF-8 conversion. Only complete characters are passed on.

struct NoConfig {};

class ByteLevelState final : public DecodeSink {
 public:
  ByteLevelState(const NoConfig&, DecodeSink* next) : next_(next) {}

  void push(std::string_view text, bool begin, bool end) override {
    if (begin && end) {
      append_bytes(text);
    } else {
      if (begin) token_.clear();
      token_.append(text);
      if (!end) return;
      append_bytes(token_);
      token_.clear();
    }
    emit(false);
  }

  void flush() override {
    if (!token_.empty()) append_bytes(token_);
    token_.clear();
    emit(true);
    next_->flush();
  }

 private:
  void append_bytes(std::string_view token) {
    size_t mark = bytes_.size();
    size_t i = 0;
    while (i < token.size()) {
      int b = unicode_to_byte(next_codepoint(token, i));
      if (b < 0) {
        bytes_.resize(mark);
        bytes_.append(token);
        return;
      }
      bytes_.push_back(char(b));
    }
  }

  void emit(bool final) {
    text_.clear();
    size_t used = append_utf8_lossy(bytes_, final, text_);
    bytes_.erase(0, used);
    if (!text_.empty() || final) {
      next_->push(text_, !started_, final);
      started_ = true;
    }
  }

  DecodeSink* next_;
  std::string token_;  // a token arriving in fragments
  std::string bytes_;  // bytes not yet converted: at most an incomplete UTF-8 sequence
  std::string text_;
  bool started_ = false;
};

// ------------------------------------------------------------------------------------------------
// Metaspace: the replacement character becomes a space, except in the first token where it is
// dropped (when a prefix space was being added at encode time).

struct MetaspaceConfig {
  std::string replacement;
  bool strip_first;
};

class MetaspaceState final : public DecodeSink {
 public:
  MetaspaceState(const MetaspaceConfig& c, DecodeSink* next) : c_(c), next_(next) {}

  void push(std::string_view text, bool begin, bool end) override {
    if (begin) ++index_;
    std::string_view with = (c_.strip_first && index_ == 0) ? "" : " ";
    out_.clear();
    size_t last = 0, pos;
    while ((pos = text.find(c_.replacement, last)) != std::string_view::npos) {
      out_.append(text.substr(last, pos - last));
      out_.append(with);
      last = pos + c_.replacement.size();
    }
    out_.append(text.substr(last));
    next_->push(out_, begin, end);
  }
  void flush() override { next_->flush(); }

 private:
  const MetaspaceConfig& c_;
  DecodeSink* next_;
  long index_ = -1;
  std::string out_;
};

// ------------------------------------------------------------------------------------------------
// Replace: per token. A token arriving in fragments is replaced as it comes for a literal
// pattern (holding back a suffix that could start a match) and at its end for a regex.

struct ReplaceConfig {
  Pattern pattern;
  std::string content;
};

class ReplaceState final : public DecodeSink {
 public:
  ReplaceState(const ReplaceConfig& c, DecodeSink* next) : c_(c), next_(next) {}

  void push(std::string_view text, bool begin, bool end) override {
    if (begin && end && buf_.empty()) {
      next_->push(c_.pattern.replace_all(text, c_.content), true, true);
      return;
    }
    if (begin) {
      buf_.clear();
      began_ = false;
    }
    buf_.append(text);
    if (end) {
      next_->push(c_.pattern.replace_all(buf_, c_.content), !began_, true);
      buf_.clear();
      began_ = false;
      return;
    }
    if (!c_.pattern.is_literal() || c_.pattern.literal_text().empty()) return;
    const std::string& lit = c_.pattern.literal_text();
    c_.pattern.find_matches(buf_, matches_);
    size_t last_end = matches_.empty() ? 0 : matches_.back().second;
    size_t cut = buf_.size();
    size_t from = std::max(last_end, buf_.size() - std::min(buf_.size(), lit.size() - 1));
    for (size_t p = from; p < buf_.size(); ++p) {
      if (lit.compare(0, buf_.size() - p, buf_, p, buf_.size() - p) == 0) {
        cut = p;
        break;
      }
    }
    std::string out = c_.pattern.replace_all(std::string_view(buf_).substr(0, cut), c_.content);
    buf_.erase(0, cut);
    if (!out.empty()) {
      next_->push(out, !began_, false);
      began_ = true;
    }
  }

  void flush() override {
    if (!buf_.empty()) next_->push(c_.pattern.replace_all(buf_, c_.content), !began_, true);
    buf_.clear();
    next_->flush();
  }

 private:
  const ReplaceConfig& c_;
  DecodeSink* next_;
  std::string buf_;
  bool began_ = false;
  std::vector<Span> matches_;
};

// ------------------------------------------------------------------------------------------------
// ByteFallback: consecutive "<0xXX>" tokens become one token holding their bytes if those form
// valid UTF-8, else one U+FFFD per byte. A group is final only when a non-byte token (or the end)
// follows.

// The byte of a "<0xXX>" token, -1 for other tokens. Like Rust's u8::from_str_radix, a '+' may
// stand before a single hex digit.
int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  int hi = hex(t[3]), lo = hex(t[4]);
  if (t[3] == '+' && lo >= 0) return lo;
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

class ByteFallbackState final : public DecodeSink {
 public:
  ByteFallbackState(const NoConfig&, DecodeSink* next) : next_(next) {}

  void push(std::string_view text, bool begin, bool end) override {
    if (begin && end) {
      whole(text);
      return;
    }
    if (begin) {
      cur_.clear();
      passthrough_ = false;
    }
    if (passthrough_) {
      next_->push(text, false, end);
      return;
    }
    cur_.append(text);
    if (end) {
      whole(cur_);
      cur_.clear();
      return;
    }
    std::string_view prefix = std::string_view("<0x").substr(0, std::min<size_t>(3, cur_.size()));
    if (cur_.size() > 6 || cur_.compare(0, prefix.size(), prefix) != 0) {
      flush_group();
      next_->push(cur_, true, false);
      cur_.clear();
      passthrough_ = true;
    }
  }

  void flush() override {
    if (!cur_.empty()) whole(cur_);
    cur_.clear();
    flush_group();
    next_->flush();
  }

 private:
  void whole(std::string_view token) {
    int b = parse_byte_token(token);
    if (b >= 0) {
      group_.push_back(char(b));
      return;
    }
    flush_group();
    next_->push(token, true, true);
  }

  void flush_group() {
    if (group_.empty()) return;
    if (is_valid_utf8(group_)) {
      next_->push(group_, true, true);
    } else {
      for (size_t i = 0; i < group_.size(); ++i) next_->push(kReplacementChar, true, true);
    }
    group_.clear();
  }

  DecodeSink* next_;
  std::string group_;
  std::string cur_;
  bool passthrough_ = false;
};

// ------------------------------------------------------------------------------------------------
// Fuse: all tokens become one.

class FuseState final : public DecodeSink {
 public:
  FuseState(const NoConfig&, DecodeSink* next) : next_(next) {}
  void push(std::string_view text, bool, bool) override {
    next_->push(text, !started_, false);
    started_ = true;
  }
  void flush() override {
    next_->push("", !started_, true);
    started_ = true;
    next_->flush();
  }

 private:
  DecodeSink* next_;
  bool started_ = false;
};

// ------------------------------------------------------------------------------------------------
// Strip: removes up to `start` leading and `stop` trailing `content` characters of each token.
// Trailing candidates are held until the token ends or another character follows.

struct StripConfig {
  std::string content;  // one character
  size_t start;
  size_t stop;
};

class StripState final : public DecodeSink {
 public:
  StripState(const StripConfig& c, DecodeSink* next) : c_(c), next_(next) {}

  void push(std::string_view text, bool begin, bool end) override {
    if (begin) {
      lead_ = 0;
      leading_ = true;
      held_ = 0;
      began_ = false;
    }
    out_.clear();
    const std::string& ch = c_.content;
    size_t i = 0;
    while (i < text.size()) {
      size_t len = utf8_seq_len(static_cast<unsigned char>(text[i]));
      std::string_view cur = text.substr(i, len);
      i += len;
      bool is_content = cur == ch;
      if (leading_) {
        if (lead_ < c_.start && is_content) {
          ++lead_;
          continue;
        }
        leading_ = false;
      }
      if (c_.stop > 0 && is_content) {
        if (held_ < c_.stop) {
          ++held_;
        } else {
          out_.append(ch);  // the oldest held one can no longer be trailing
        }
        continue;
      }
      for (; held_ > 0; --held_) out_.append(ch);
      out_.append(cur);
    }
    if (end) held_ = 0;
    if (!out_.empty() || end) {
      next_->push(out_, !began_, end);
      began_ = true;
    }
  }
  void flush() override { next_->flush(); }

 private:
  const StripConfig& c_;
  DecodeSink* next_;
  size_t lead_ = 0;
  bool leading_ = true;
  size_t held_ = 0;
  bool began_ = false;
  std::string out_;
};

// ------------------------------------------------------------------------------------------------
// No decoder: tokens joined by single spaces.

class JoinState final : public DecodeSink {
 public:
  JoinState(const NoConfig&, DecodeSink* next) : next_(next) {}
  void push(std::string_view text, bool begin, bool end) override {
    if (begin && count_++ > 0) next_->push(" ", false, false);
    next_->push(text, begin, end);
  }
  void flush() override { next_->flush(); }

 private:
  DecodeSink* next_;
  size_t count_ = 0;
};

bool metaspace_strips_first(const Node& node) {
  if (node.has("prepend_scheme")) {
    std::string scheme = node.str("prepend_scheme");
    if (scheme != "always" && scheme != "first" && scheme != "never") {
      node.at("prepend_scheme").fail("expected always, first or never, got \"", scheme, "\"");
    }
    return scheme != "never";
  }
  return node.boolean("add_prefix_space", true);
}

std::string single_char(const Node& node, std::string_view key, std::string fallback) {
  if (!node.has(key)) return fallback;
  Node n = node.at(key);
  std::string s = n.as_string();
  if (s.empty() || utf8_seq_len(static_cast<unsigned char>(s[0])) != s.size()) {
    n.fail("expected a single character, got \"", s, "\"");
  }
  return s;
}

void add_steps(const Node& node, std::vector<std::unique_ptr<DecoderStep>>& steps) {
  std::string type = node.type();
  if (type == "Sequence") {
    Node list = node.at("decoders");
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_null()) add_steps(list[i], steps);
    }
  } else if (type == "ByteLevel") {
    steps.push_back(std::make_unique<Step<ByteLevelState, NoConfig>>(NoConfig{}));
  } else if (type == "Metaspace") {
    steps.push_back(std::make_unique<Step<MetaspaceState, MetaspaceConfig>>(MetaspaceConfig{
        single_char(node, "replacement", "\xE2\x96\x81"), metaspace_strips_first(node)}));
  } else if (type == "Replace") {
    steps.push_back(std::make_unique<Step<ReplaceState, ReplaceConfig>>(
        ReplaceConfig{Pattern::from_node(node.at("pattern")), node.str("content")}));
  } else if (type == "ByteFallback") {
    steps.push_back(std::make_unique<Step<ByteFallbackState, NoConfig>>(NoConfig{}));
  } else if (type == "Fuse") {
    steps.push_back(std::make_unique<Step<FuseState, NoConfig>>(NoConfig{}));
  } else if (type == "Strip") {
    int64_t start = node.integer("start", 0), stop = node.integer("stop", 0);
    if (start < 0 || stop < 0)
      node.fail("expected non-negative start/stop, got ", start, "/", stop);
    steps.push_back(std::make_unique<Step<StripState, StripConfig>>(
        StripConfig{single_char(node, "content", " "), size_t(start), size_t(stop)}));
  } else {
    node.unsupported("ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence");
  }
}

}  // namespace

Decoder::Decoder(const Node& node) {
  if (node.is_null()) {
    steps_.push_back(std::make_unique<Step<JoinState, NoConfig>>(NoConfig{}));
  } else {
    add_steps(node, steps_);
  }
}

Decoder::Stream Decoder::start(DecodeSink* out) const {
  Stream s;
  s.stages.resize(steps_.size());
  DecodeSink* next = out;
  for (size_t i = steps_.size(); i-- > 0;) {
    s.stages[i] = steps_[i]->start(next);
    next = s.stages[i].get();
  }
  if (s.stages.empty()) {
    // An empty Sequence: tokens are concatenated as they are.
    s.stages.push_back(Step<FuseState, NoConfig>(NoConfig{}).start(out));
  }
  return s;
}

}  // namespace lmx::tok
