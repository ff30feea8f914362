// Python's str methods as templates call them ('a,b'.split(','), s.strip(), '{}'.format(x), ...),
// on code points and with Python's whitespace set.
#include <utf8proc.h>

#include <algorithm>

#include "chat/builtins.h"
#include "chat/template_error.h"
#include "tokenizer/unicode.h"

namespace lmx::chat {

namespace {

bool py_space(char32_t c) { return tok::is_whitespace(c) || (c >= 0x1c && c <= 0x1f); }

std::vector<char32_t> decode(const std::string& s) {
  std::vector<char32_t> out;
  for (size_t i = 0; i < s.size();) out.push_back(tok::next_codepoint(s, i));
  return out;
}
std::string encode(const std::vector<char32_t>& cps, size_t b = 0, size_t e = std::string::npos) {
  std::string out;
  for (size_t k = b; k < std::min(e, cps.size()); ++k) tok::append_utf8(out, cps[k]);
  return out;
}

std::string map_case(const std::string& s, bool upper) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = tok::next_codepoint(s, i);
    tok::append_utf8(
        out, static_cast<char32_t>(upper ? utf8proc_toupper(static_cast<utf8proc_int32_t>(c))
                                         : utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
  }
  return out;
}

bool is_cased(char32_t c) {
  return utf8proc_toupper(static_cast<utf8proc_int32_t>(c)) != static_cast<utf8proc_int32_t>(c) ||
         utf8proc_tolower(static_cast<utf8proc_int32_t>(c)) != static_cast<utf8proc_int32_t>(c);
}

const std::string& need_str(const Value& v, const char* what) {
  if (!v.is_string())
    throw TemplateError(std::string(what) + " argument must be str, not " + type_name(v));
  return v.s;
}

int64_t arg_int(const CallArgs& a, size_t i, const char* name, int64_t fallback) {
  const Value* v = a.get(i, name);
  return v && !v->is_none() ? v->as_int() : fallback;
}

List split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
  List out;
  if (!sep || sep->is_none()) {
    std::vector<char32_t> cps = decode(s);
    if (from_right) std::reverse(cps.begin(), cps.end());
    size_t i = 0;
    std::vector<std::string> parts;
    while (true) {
      while (i < cps.size() && py_space(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = cps.size();
        while (e > i && py_space(cps[e - 1])) --e;
        std::vector<char32_t> rest(cps.begin() + i, cps.begin() + e);
        if (from_right) std::reverse(rest.begin(), rest.end());
        parts.push_back(encode(rest));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !py_space(cps[j])) ++j;
      std::vector<char32_t> word(cps.begin() + i, cps.begin() + j);
      if (from_right) std::reverse(word.begin(), word.end());
      parts.push_back(encode(word));
      i = j;
    }
    if (from_right) std::reverse(parts.begin(), parts.end());
    for (auto& p : parts) out.push_back(Value::string(std::move(p)));
    return out;
  }
  const std::string& d = need_str(*sep, "split()");
  if (d.empty()) throw TemplateError("empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t pos = 0;
    while (true) {
      const size_t at = s.find(d, pos);
      if (at == std::string::npos ||
          (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
        parts.push_back(s.substr(pos));
        break;
      }
      parts.push_back(s.substr(pos, at - pos));
      pos = at + d.size();
    }
  } else {
    size_t end = s.size();
    while (true) {
      const size_t at = end >= d.size() ? s.rfind(d, end - d.size()) : std::string::npos;
      if (at == std::string::npos ||
          (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
        parts.push_back(s.substr(0, end));
        break;
      }
      parts.push_back(s.substr(at + d.size(), end - at - d.size()));
      end = at;
    }
    std::reverse(parts.begin(), parts.end());
  }
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  std::string out;
  if (from.empty()) {
    const auto chars = utf8_chars(s);
    int64_t n = 0;
    for (const auto& c : chars) {
      if (count < 0 || n < count) out += to, ++n;
      out += c;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t at = s.find(from, pos);
    if (at == std::string::npos) break;
    out += s.substr(pos, at - pos) + to;
    pos = at + from.size();
  }
  return out + s.substr(pos);
}

bool affix_match(const std::string& s, const Value& what, bool prefix) {
  const auto one = [&](const Value& w) {
    const std::string& x = need_str(w, prefix ? "startswith" : "endswith");
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (what.is_list()) {
    for (const auto& w : *what.list)
      if (one(w)) return true;
    return false;
  }
  return one(what);
}

// Byte offset to code point index (for find/rfind results).
int64_t cp_index(const std::string& s, size_t byte) {
  return static_cast<int64_t>(tok::count_codepoints(std::string_view(s).substr(0, byte)));
}

std::string str_format(const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{')
      out += '{', ++i;
    else if (fmt[i] == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}')
      out += '}', ++i;
    else if (fmt[i] == '{') {
      const size_t close = fmt.find('}', i);
      if (close == std::string::npos)
        throw TemplateError("Single '{' encountered in format string");
      const std::string field = fmt.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!") != std::string::npos)
        throw TemplateError("str.format: format specs and conversions are not supported: {" +
                            field + "}");
      const Value* v = nullptr;
      if (field.empty())
        v = a.get(auto_idx++, "\x01");
      else if (std::isdigit(static_cast<unsigned char>(field[0])))
        v = field.size() < 10 ? a.get(std::stoul(field), "\x01") : nullptr;
      else
        v = a.get(static_cast<size_t>(-1), field);
      if (!v) throw TemplateError("format(): missing argument '" + field + "'");
      out += to_str(*v);
      i = close;
    } else {
      out += fmt[i];
    }
  }
  return out;
}

Value str_method_impl(const std::string& s, const std::string& name, const CallArgs& a) {
  const Value* a0 = a.get(0, "\x01");
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Value::string(py_strip(s, a0, name != "rstrip", name != "lstrip"));
  if (name == "upper") return Value::string(py_upper(s));
  if (name == "lower") return Value::string(py_lower(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "startswith" || name == "endswith") {
    if (!a0) throw TemplateError(name + "() takes at least 1 argument");
    return Value::boolean(affix_match(s, *a0, name == "startswith"));
  }
  if (name == "split" || name == "rsplit")
    return Value::make_list(
        split(s, a.get(0, "sep"), arg_int(a, 1, "maxsplit", -1), name == "rsplit"));
  if (name == "splitlines") {
    List out;
    size_t pos = 0;
    while (pos < s.size()) {
      size_t e = s.find_first_of("\n\r", pos);
      if (e == std::string::npos) e = s.size();
      out.push_back(Value::string(s.substr(pos, e - pos)));
      pos = e + (s.compare(e, 2, "\r\n") == 0 ? 2 : 1);
    }
    return Value::make_list(std::move(out));
  }
  if (name == "replace") {
    const Value* b = a.get(1, "\x01");
    if (!a0 || !b) throw TemplateError("replace() takes at least 2 arguments");
    return Value::string(replace(s, need_str(*a0, "replace()"), need_str(*b, "replace()"),
                                 arg_int(a, 2, "count", -1)));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    if (!a0) throw TemplateError(name + "() takes at least 1 argument");
    const std::string& x = need_str(*a0, name.c_str());
    if (name == "count") {
      if (x.empty()) return Value::integer(static_cast<int64_t>(tok::count_codepoints(s)) + 1);
      int64_t n = 0;
      for (size_t p = s.find(x); p != std::string::npos; p = s.find(x, p + x.size())) ++n;
      return Value::integer(n);
    }
    const size_t at = name[0] == 'r' ? s.rfind(x) : s.find(x);
    if (at == std::string::npos && name.find("index") != std::string::npos)
      throw TemplateError("substring not found");
    return Value::integer(at == std::string::npos ? -1 : cp_index(s, at));
  }
  if (name == "join") {
    if (!a0) throw TemplateError("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const auto& item : iterate(*a0)) {
      if (!first) out += s;
      first = false;
      out += need_str(item, "sequence item");
    }
    return Value::string(out);
  }
  if (name == "format") return Value::string(str_format(s, a));
  const auto all = [&](auto pred) {
    if (s.empty()) return Value::boolean(false);
    for (char32_t c : decode(s))
      if (!pred(c)) return Value::boolean(false);
    return Value::boolean(true);
  };
  const auto cat = [](char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); };
  if (name == "isspace") return all(py_space);
  if (name == "isdigit") return all([&](char32_t c) { return cat(c) == UTF8PROC_CATEGORY_ND; });
  if (name == "isalpha")
    return all([&](char32_t c) {
      return cat(c) >= UTF8PROC_CATEGORY_LU && cat(c) <= UTF8PROC_CATEGORY_LO;
    });
  if (name == "isalnum")
    return all([&](char32_t c) {
      return (cat(c) >= UTF8PROC_CATEGORY_LU && cat(c) <= UTF8PROC_CATEGORY_LO) ||
             tok::is_numeric(c);
    });
  if (name == "isupper") return Value::boolean(py_upper(s) == s && py_lower(s) != s);
  if (name == "islower") return Value::boolean(py_lower(s) == s && py_upper(s) != s);
  throw TemplateError("'str' object has no attribute '" + name + "'");
}

const char* kStrMethods[] = {
    "strip",      "lstrip",   "rstrip",  "upper",   "lower",      "title",   "capitalize",
    "startswith", "endswith", "split",   "rsplit",  "splitlines", "replace", "find",
    "rfind",      "index",    "rindex",  "count",   "join",       "format",  "isspace",
    "isdigit",    "isalpha",  "isalnum", "isupper", "islower"};

}  // namespace

bool is_str_method(const std::string& name) {
  return std::find(std::begin(kStrMethods), std::end(kStrMethods), name) != std::end(kStrMethods);
}

Value str_method(const std::string& s, const std::string& name, const CallArgs& args) {
  return str_method_impl(s, name, args);
}

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  const std::vector<char32_t> cps = decode(s);
  std::vector<char32_t> set;
  const bool ws = !chars || chars->is_none();
  if (!ws) set = decode(need_str(*chars, "strip"));
  const auto strip = [&](char32_t c) {
    return ws ? py_space(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip(cps[b])) ++b;
  if (right)
    while (e > b && strip(cps[e - 1])) --e;
  return encode(cps, b, e);
}
std::string py_upper(const std::string& s) { return map_case(s, true); }
std::string py_lower(const std::string& s) { return map_case(s, false); }
std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = tok::next_codepoint(s, i);
    const auto ci = static_cast<utf8proc_int32_t>(c);
    tok::append_utf8(
        out, static_cast<char32_t>(prev_cased ? utf8proc_tolower(ci) : utf8proc_totitle(ci)));
    prev_cased = is_cased(c);
  }
  return out;
}
std::string py_capitalize(const std::string& s) {
  std::vector<char32_t> cps = decode(s);
  for (size_t k = 0; k < cps.size(); ++k) {
    const auto ci = static_cast<utf8proc_int32_t>(cps[k]);
    cps[k] = static_cast<char32_t>(k == 0 ? utf8proc_totitle(ci) : utf8proc_tolower(ci));
  }
  return encode(cps);
}

}  // namespace lmx::chat
