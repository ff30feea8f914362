#include "tokenizer/normalizer.h"

#include <vector>

#include "tokenizer/pattern.h"
#include "tokenizer/unicode.h"

namespace lmx::tok {

namespace {

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {}
  void normalize(std::string& s) const override { s = normalize_unicode(s, form_); }

 private:
  NormalForm form_;
};

class Lowercase final : public Normalizer {
 public:
  void normalize(std::string& s) const override { s = lowercase(s); }
};

class StripAccents final : public Normalizer {
 public:
  void normalize(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
      size_t start = i;
      char32_t cp = next_codepoint(s, i);
      if (!is_mark(cp)) out.append(s, start, i - start);
    }
    s = std::move(out);
  }
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& s) const override {
    size_t begin = 0, end = s.size();
    if (left_) {
      while (begin < end) {
        size_t i = begin;
        if (!is_whitespace(next_codepoint(s, i))) break;
        begin = i;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!is_whitespace(next_codepoint(s, i))) break;
        end = start;
      }
    }
    s = s.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Replace final : public Normalizer {
 public:
  Replace(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& s) const override { s = pattern_.replace_all(s, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void normalize(std::string& s) const override {
    for (const auto& n : steps_) n->normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const Node& node) {
  if (node.is_null()) return nullptr;
  std::string type = node.type();
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalForm::NFKD);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Strip") {
    return std::make_unique<Strip>(node.boolean("strip_left", true),
                                   node.boolean("strip_right", true));
  }
  if (type == "Prepend") return std::make_unique<Prepend>(node.str("prepend"));
  if (type == "Replace") {
    return std::make_unique<Replace>(Pattern::from_node(node.at("pattern")), node.str("content"));
  }
  if (type == "Sequence") {
    Node list = node.at("normalizers");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      if (auto n = make_normalizer(list[i])) steps.push_back(std::move(n));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  node.unsupported(
      "NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, Strip, Prepend, Replace, Sequence");
}

}  // namespace lmx::tok
