#include "train/yaml.h"

#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace lmx::train {

namespace {

struct Line {
  int number = 0;  // 1-based, for errors
  int indent = 0;
  std::string text;  // without indentation and comment
};

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(" \t\r");
  return s.substr(a, b - a + 1);
}

// Drops a `#` comment outside quotes (a `#` must follow a space or start the line).
std::string strip_comment(const std::string& s) {
  char quote = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#' && (i == 0 || s[i - 1] == ' ' || s[i - 1] == '\t')) {
      return s.substr(0, i);
    }
  }
  return s;
}

class Parser {
 public:
  Parser(std::vector<Line> lines, std::string source)
      : lines_(std::move(lines)), source_(std::move(source)) {}

  json document() {
    if (lines_.empty()) return nullptr;
    json v = block(lines_[0].indent);
    if (pos_ < lines_.size()) error(lines_[pos_], "unexpected indentation");
    return v;
  }

 private:
  [[noreturn]] void error(const Line& l, const std::string& what) const {
    fail(source_ + ":" + std::to_string(l.number), what, ": '", l.text, "'");
  }

  static bool is_item(const std::string& t) { return t == "-" || t.rfind("- ", 0) == 0; }

  // `key: value` -> (key, value); npos when the line is not a mapping entry.
  static std::optional<std::pair<std::string, std::string>> split_key(const std::string& t) {
    char quote = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      const char c = t[i];
      if (quote) {
        if (c == quote) quote = 0;
        continue;
      }
      if ((c == '"' || c == '\'') && i == 0) {
        quote = c;
        continue;
      }
      if (c == '[' || c == '{') return std::nullopt;
      if (c == ':' && (i + 1 == t.size() || t[i + 1] == ' ')) {
        std::string key = trim(t.substr(0, i));
        if (key.size() >= 2 && (key[0] == '"' || key[0] == '\'') && key.back() == key[0])
          key = key.substr(1, key.size() - 2);
        return std::make_pair(key, trim(t.substr(i + 1)));
      }
    }
    return std::nullopt;
  }

  json block(int indent) {
    const Line& first = lines_[pos_];
    if (is_item(first.text)) return sequence(indent);
    if (split_key(first.text)) return mapping(indent);
    ++pos_;
    return scalar_or_flow(first.text, first);
  }

  json mapping(int indent) {
    json out = json::object();
    while (pos_ < lines_.size() && lines_[pos_].indent == indent) {
      const Line& l = lines_[pos_];
      auto kv = split_key(l.text);
      if (!kv) error(l, "expected 'key: value'");
      ++pos_;
      out[kv->first] = value_after(kv->second, l, indent);
    }
    return out;
  }

  json sequence(int indent) {
    json out = json::array();
    while (pos_ < lines_.size() && lines_[pos_].indent == indent && is_item(lines_[pos_].text)) {
      Line& l = lines_[pos_];
      const std::string rest = trim(l.text.substr(1));
      if (rest.empty()) {
        ++pos_;
        out.push_back(value_after("", l, indent));
      } else if (split_key(rest)) {
        // "- key: value" opens a mapping at the column after "- ".
        l.indent += 2;
        l.text = rest;
        out.push_back(mapping(l.indent));
      } else {
        ++pos_;
        out.push_back(scalar_or_flow(rest, l));
      }
    }
    return out;
  }

  // The value of `key:` or `-`: inline text, else the more indented block below (null if none).
  json value_after(const std::string& inline_text, const Line& l, int indent) {
    if (!inline_text.empty()) return scalar_or_flow(inline_text, l);
    if (pos_ < lines_.size() && lines_[pos_].indent > indent) return block(lines_[pos_].indent);
    // A sequence may sit at its key's indentation.
    if (pos_ < lines_.size() && lines_[pos_].indent == indent && is_item(lines_[pos_].text))
      return sequence(indent);
    return nullptr;
  }

  json scalar_or_flow(const std::string& t, const Line& l) {
    size_t at = 0;
    json v = flow(t, at, l);
    while (at < t.size() && t[at] == ' ') ++at;
    if (at != t.size()) error(l, "unexpected text after a value");
    return v;
  }

  json flow(const std::string& t, size_t& at, const Line& l, bool in_flow = false) {
    while (at < t.size() && t[at] == ' ') ++at;
    if (at < t.size() && (t[at] == '[' || t[at] == '{')) {
      const char close = t[at] == '[' ? ']' : '}';
      const bool map = t[at] == '{';
      json out = map ? json::object() : json::array();
      ++at;
      while (true) {
        while (at < t.size() && t[at] == ' ') ++at;
        if (at < t.size() && t[at] == close) {
          ++at;
          return out;
        }
        if (map) {
          json key = flow(t, at, l, true);
          while (at < t.size() && t[at] == ' ') ++at;
          if (at >= t.size() || t[at] != ':') error(l, "expected ':' in a flow mapping");
          ++at;
          out[key.is_string() ? key.get<std::string>() : key.dump()] = flow(t, at, l, true);
        } else {
          out.push_back(flow(t, at, l, true));
        }
        while (at < t.size() && t[at] == ' ') ++at;
        if (at < t.size() && t[at] == ',') {
          ++at;
        } else if (at >= t.size() || t[at] != close) {
          error(l, std::string("expected ',' or '") + close + "'");
        }
      }
    }
    if (at < t.size() && (t[at] == '"' || t[at] == '\'')) {
      const char q = t[at++];
      std::string s;
      while (at < t.size() && t[at] != q) {
        if (q == '"' && t[at] == '\\' && at + 1 < t.size()) {
          const char e = t[++at];
          s += e == 'n' ? '\n' : e == 't' ? '\t' : e;
        } else {
          s += t[at];
        }
        ++at;
      }
      if (at >= t.size()) error(l, "unterminated quoted string");
      ++at;
      return s;
    }
    const size_t start = at;
    while (at < t.size() &&
           !(in_flow && (t[at] == ',' || t[at] == ']' || t[at] == '}' ||
                         (t[at] == ':' && (at + 1 == t.size() || t[at + 1] == ' ')))))
      ++at;
    return plain(trim(t.substr(start, at - start)));
  }

  static json plain(const std::string& s) {
    if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
    static const std::regex integer(R"([-+]?(0|[1-9][0-9_]*))");
    // yaml's float plus mlx-lm's resolver (exponent without a dot: 1e-5).
    static const std::regex real(
        R"([-+]?([0-9][0-9_]*)\.[0-9_]*([eE][-+]?[0-9]+)?)"
        R"(|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+)"
        R"(|\.[0-9_]+([eE][-+][0-9]+)?)");
    std::string digits;
    for (char c : s)
      if (c != '_') digits += c;
    if (std::regex_match(s, integer)) return std::stoll(digits);
    if (std::regex_match(s, real)) return std::stod(digits);
    if (s == ".inf" || s == "+.inf") return std::numeric_limits<double>::infinity();
    if (s == "-.inf") return -std::numeric_limits<double>::infinity();
    return s;
  }

  std::vector<Line> lines_;
  std::string source_;
  size_t pos_ = 0;
};

}  // namespace

json parse_yaml(const std::string& text, const std::string& source) {
  std::vector<Line> lines;
  std::istringstream in(text);
  std::string raw;
  int number = 0;
  while (std::getline(in, raw)) {
    ++number;
    if (raw.rfind("---", 0) == 0 || raw.rfind("%", 0) == 0) continue;
    const std::string body = strip_comment(raw);
    const std::string t = trim(body);
    if (t.empty()) continue;
    check(body.find('\t') == std::string::npos || body.find('\t') > body.find_first_not_of(" \t"),
          source + ":" + std::to_string(number), "tabs are not allowed for indentation");
    lines.push_back({number, static_cast<int>(body.find_first_not_of(' ')), t});
  }
  return Parser(std::move(lines), source).document();
}

json read_yaml_file(const std::filesystem::path& path) {
  std::ifstream f(path);
  check(f.good(), path.string(), "cannot open the config file");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_yaml(ss.str(), path.string());
}

}  // namespace lmx::train
