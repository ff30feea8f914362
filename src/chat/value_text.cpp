// Python's text forms of values: str(), repr(), float.__repr__, json.dumps (transformers' tojson)
// and markupsafe.escape.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "chat/template_error.h"
#include "chat/value.h"
#include "tokenizer/unicode.h"

namespace lmx::chat {

// float.__repr__: the shortest round-trip digits, exponent form outside [1e-4, 1e16).
std::string py_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  const size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e_pos + 1));
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (digits.size() <= static_cast<size_t>(exp) + 1) {
        out += digits + std::string(exp + 1 - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
      }
    } else {
      out += "0." + std::string(-exp - 1, '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out.append(".").append(digits.substr(1));
  char eb[16];
  std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + eb;
}

namespace {

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == quote)
      out += std::string("\\") + static_cast<char>(c);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + quote;
}

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    if (c >= 0x80 && ensure_ascii) {
      char32_t cp = tok::next_codepoint(s, i);
      char b[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof(b), "\\u%04x\\u%04x", 0xD800 + (static_cast<unsigned>(cp) >> 10),
                      0xDC00 + (static_cast<unsigned>(cp) & 0x3FF));
      } else {
        std::snprintf(b, sizeof(b), "\\u%04x", static_cast<unsigned>(cp));
      }
      out += b;
      continue;
    }
    ++i;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void dump(const Value& v, const JsonDumpOptions& opt, int level, std::string& out) {
  const auto newline = [&](int lvl) {
    out += '\n';
    out.append(static_cast<size_t>(opt.indent) * lvl, ' ');
  };
  switch (v.kind) {
    case Value::Kind::None:
      out += "null";
      return;
    case Value::Kind::Bool:
      out += v.b ? "true" : "false";
      return;
    case Value::Kind::Int:
      out += std::to_string(v.i);
      return;
    case Value::Kind::Float:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f < 0 ? "-Infinity" : "Infinity";
      else
        out += py_float_repr(v.f);
      return;
    case Value::Kind::String:
      json_string(v.s, opt.ensure_ascii, out);
      return;
    case Value::Kind::List: {
      if (v.generator) break;
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += opt.item_sep;
        if (opt.indent >= 0) newline(level + 1);
        dump((*v.list)[k], opt, level + 1, out);
      }
      if (opt.indent >= 0) newline(level);
      out += ']';
      return;
    }
    case Value::Kind::Dict: {
      if (v.dict->is_namespace) break;
      if (v.dict->entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& e : v.dict->entries) items.push_back(&e);
      if (opt.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += opt.item_sep;
        if (opt.indent >= 0) newline(level + 1);
        const Value key = v.dict->key_value(items[k]->first);
        // json.dumps turns int/float/bool/None keys into strings.
        json_string(key.is_string()                 ? key.s
                    : key.is_none()                 ? "null"
                    : key.kind == Value::Kind::Bool ? (key.b ? "true" : "false")
                                                    : to_str(key),
                    opt.ensure_ascii, out);
        out += opt.key_sep;
        dump(items[k]->second, opt, level + 1, out);
      }
      if (opt.indent >= 0) newline(level);
      out += '}';
      return;
    }
    default:
      break;
  }
  throw TemplateError(std::string("Object of type ") + type_name(v) + " is not JSON serializable");
}

}  // namespace

std::string to_repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::String:
      return v.markup ? "Markup(" + repr_string(v.s) + ")" : repr_string(v.s);
    case Value::Kind::List: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += to_repr((*v.list)[k]);
      }
      if (v.tuple) return out + (v.list->size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Value::Kind::Dict: {
      std::string out = v.dict->is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, item] : v.dict->entries) {
        if (!first) out += ", ";
        first = false;
        out += to_repr(v.dict->key_value(k)) + ": " + to_repr(item);
      }
      return out + (v.dict->is_namespace ? "}>" : "}");
    }
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
      return "";
    case Value::Kind::None:
      return "None";
    case Value::Kind::Bool:
      return v.b ? "True" : "False";
    case Value::Kind::Int:
      return std::to_string(v.i);
    case Value::Kind::Float:
      return py_float_repr(v.f);
    case Value::Kind::String:
      return v.s;
    case Value::Kind::Callable:
      return "<function " + v.fn->name + ">";
    default:
      return to_repr(v);
  }
}

std::string json_dumps(const Value& v, const JsonDumpOptions& opt) {
  std::string out;
  dump(v, opt, 0, out);
  return out;
}

Value from_json(const ojson& j) { return from_json(j, 0); }

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace lmx::chat
