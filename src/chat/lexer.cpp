#include "chat/lexer.h"

#include <algorithm>
#include <cctype>
#include <cstdint>

#include "chat/template_error.h"
#include "tokenizer/unicode.h"

namespace lmx::chat {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string rstrip(std::string s) {
  while (!s.empty() && is_space(s.back())) s.pop_back();
  return s;
}

// jinja2's lexer normalizes "\r\n" and "\r" to "\n" and drops one trailing newline.
std::string normalize(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Python's "unicode-escape" decoding of a string literal's body.
std::string unescape(const std::string& body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char c = body[++i];
    const auto hex = [&](size_t n) {
      if (i + n >= body.size()) throw TemplateError("truncated \\x/\\u escape", line);
      uint32_t cp = 0;
      for (size_t k = 1; k <= n; ++k) {
        const char h = body[i + k];
        if (!std::isxdigit(static_cast<unsigned char>(h)))
          throw TemplateError("bad \\x/\\u escape", line);
        cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                 ? h - '0'
                                                 : (h | 0x20) - 'a' + 10);
      }
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000))
        throw TemplateError("bad code point in \\U escape", line);
      i += n;
      tok::append_utf8(out, static_cast<char32_t>(cp));
    };
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case '\n':
        break;
      case 'x':
        hex(2);
        break;
      case 'u':
        hex(4);
        break;
      case 'U':
        hex(8);
        break;
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = 0;
          size_t n = 0;
          while (n < 3 && i < body.size() && body[i] >= '0' && body[i] <= '7')
            v = v * 8 + (body[i++] - '0'), ++n;
          --i;
          tok::append_utf8(out, static_cast<char32_t>(v));
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(const std::string& src) : s_(normalize(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < s_.size()) {
      const size_t open = find_open(pos_);
      std::string text = s_.substr(pos_, (open == std::string::npos ? s_.size() : open) - pos_);
      if (open == std::string::npos) {
        emit_text(text);
        pos_ = s_.size();
        break;
      }
      const char kind = s_[open + 1];
      const char sign = open + 2 < s_.size() ? s_[open + 2] : '\0';
      if (sign == '-') {
        text = rstrip(text);
      } else if (sign != '+' && kind != '{') {
        lstrip(text, line_starting);
      }
      emit_text(text);
      line_ += static_cast<int>(std::count(s_.begin() + pos_, s_.begin() + open, '\n'));
      pos_ = open + 2 + (sign == '-' || sign == '+' ? 1 : 0);
      if (kind == '#') {
        line_starting = comment();
      } else {
        line_starting = tag(kind == '{');
      }
    }
    tokens_.push_back({Token::Type::Eof, "", line_});
    return std::move(tokens_);
  }

 private:
  // lstrip_blocks: drop the whitespace between the line start and a block or comment tag.
  static void lstrip(std::string& text, bool line_starting) {
    const size_t l_pos = text.rfind('\n') + 1;  // npos + 1 == 0
    if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
        std::all_of(text.begin() + static_cast<std::ptrdiff_t>(l_pos), text.end(), is_space))
      text.resize(l_pos);
  }

  size_t find_open(size_t from) const {
    for (size_t i = s_.find('{', from); i != std::string::npos; i = s_.find('{', i + 1)) {
      if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  void emit_text(const std::string& text) {
    if (!text.empty()) tokens_.push_back({Token::Type::Text, text, line_});
  }

  // After `%}` / `#}`: `-` eats all following whitespace, `+` nothing, else one "\n" (trim_blocks).
  // Returns whether what was consumed ends with a newline (jinja2's line_starting).
  bool after_end(char sign, size_t end_pos, bool trim) {
    pos_ = end_pos;
    const size_t start = pos_;
    if (sign == '-') {
      while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
    } else if (sign != '+' && trim && pos_ < s_.size() && s_[pos_] == '\n') {
      ++pos_;
    }
    line_ += static_cast<int>(std::count(s_.begin() + start, s_.begin() + pos_, '\n'));
    return pos_ > 0 && s_[pos_ - 1] == '\n';
  }

  bool comment() {
    const size_t close = s_.find("#}", pos_);
    if (close == std::string::npos) throw TemplateError("missing end of comment tag", line_);
    line_ += static_cast<int>(std::count(s_.begin() + pos_, s_.begin() + close, '\n'));
    const char sign = close > pos_ ? s_[close - 1] : '\0';
    return after_end(sign == '-' || sign == '+' ? sign : '\0', close + 2, true);
  }

  bool tag(bool variable) {
    const int begin_line = line_;
    const size_t first = tokens_.size();
    tokens_.push_back({variable ? Token::Type::VarBegin : Token::Type::BlockBegin, "", line_});
    int depth = 0;
    const char* close = variable ? "}}" : "%}";
    while (true) {
      while (pos_ < s_.size() && is_space(s_[pos_])) {
        if (s_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= s_.size())
        throw TemplateError(std::string("unexpected end of template, expected '") + close + "'",
                            begin_line);
      if (depth == 0) {
        const char c = s_[pos_];
        const bool signed_end =
            (c == '-' || (c == '+' && !variable)) && s_.compare(pos_ + 1, 2, close) == 0;
        if (signed_end || s_.compare(pos_, 2, close) == 0) {
          // {% raw %} keeps the newline after it (jinja2's raw_begin rule has no trim_blocks).
          const bool is_raw = !variable && tokens_.size() == first + 2 &&
                              tokens_[first + 1].type == Token::Type::Name &&
                              tokens_[first + 1].value == "raw";
          tokens_.push_back({variable ? Token::Type::VarEnd : Token::Type::BlockEnd, "", line_});
          const bool ls =
              after_end(signed_end ? c : '\0', pos_ + (signed_end ? 3 : 2), !variable && !is_raw);
          return is_raw ? raw(first, ls) : ls;
        }
      }
      lex_one(depth);
    }
  }

  // {% raw %}...{% endraw %}: the body is text.
  bool raw(size_t first, bool line_starting) {
    tokens_.resize(first);
    for (size_t at = s_.find("{%", pos_); at != std::string::npos; at = s_.find("{%", at + 2)) {
      size_t p = at + 2;
      const char sign = p < s_.size() && (s_[p] == '-' || s_[p] == '+') ? s_[p++] : '\0';
      while (p < s_.size() && is_space(s_[p])) ++p;
      if (s_.compare(p, 6, "endraw") != 0) continue;
      p += 6;
      while (p < s_.size() && is_space(s_[p])) ++p;
      const char esign = p < s_.size() && (s_[p] == '-' || s_[p] == '+') ? s_[p++] : '\0';
      if (s_.compare(p, 2, "%}") != 0) continue;
      std::string text = s_.substr(pos_, at - pos_);
      if (sign == '-')
        text = rstrip(text);
      else if (sign != '+')
        lstrip(text, line_starting);
      emit_text(text);
      line_ += static_cast<int>(std::count(s_.begin() + pos_, s_.begin() + p, '\n'));
      return after_end(esign, p + 2, true);
    }
    throw TemplateError("missing endraw", line_);
  }

  void lex_one(int& depth) {
    const char c = s_[pos_];
    const auto push = [&](Token::Type t, std::string v) {
      tokens_.push_back({t, std::move(v), line_});
    };
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos_;
      while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_'))
        ++e;
      push(Token::Type::Name, s_.substr(pos_, e - pos_));
      pos_ = e;
      return;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = pos_;
      const auto digits = [&] {
        while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_'))
          ++e;
      };
      digits();
      bool is_float = false;
      const bool after_dot =
          !tokens_.empty() && tokens_.back().type == Token::Type::Op && tokens_.back().value == ".";
      if (!after_dot && e + 1 < s_.size() && s_[e] == '.' &&
          std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
        ++e;
        digits();
        is_float = true;
      }
      if (!after_dot && e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
        size_t x = e + 1;
        if (x < s_.size() && (s_[x] == '+' || s_[x] == '-')) ++x;
        if (x < s_.size() && std::isdigit(static_cast<unsigned char>(s_[x]))) {
          e = x;
          digits();
          is_float = true;
        }
      }
      std::string num = s_.substr(pos_, e - pos_);
      num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
      push(is_float ? Token::Type::Float : Token::Type::Int, num);
      pos_ = e;
      return;
    }
    if (c == '\'' || c == '"') {
      size_t e = pos_ + 1;
      while (e < s_.size() && s_[e] != c) e += s_[e] == '\\' ? 2 : 1;
      if (e >= s_.size()) throw TemplateError("unexpected end of string", line_);
      const std::string body = s_.substr(pos_ + 1, e - pos_ - 1);
      push(Token::Type::String, unescape(body, line_));
      line_ += static_cast<int>(std::count(body.begin(), body.end(), '\n'));
      pos_ = e + 1;
      return;
    }
    static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kTwo)
      if (s_.compare(pos_, 2, op) == 0) {
        push(Token::Type::Op, op);
        pos_ += 2;
        return;
      }
    if (std::string("+-/*%~[](){}=<>.:|,;").find(c) == std::string::npos)
      throw TemplateError(std::string("unexpected char '") + c + "'", line_);
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') --depth;
    push(Token::Type::Op, std::string(1, c));
    ++pos_;
  }

  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(const std::string& source) { return Lexer(source).run(); }

}  // namespace lmx::chat
