// jinja2's string and number filters (jinja2/filters.py) with transformers' tojson (json.dumps,
// ensure_ascii=False, no HTML escaping), and Python's printf-style `%` formatting.
#include <utf8proc.h>

#include <cmath>
#include <cstdio>

#include "chat/builtins.h"
#include "chat/filter_args.h"
#include "chat/template_error.h"
#include "tokenizer/unicode.h"

namespace lmx::chat {

namespace filter_detail {

namespace {

std::string indent(std::string s, const CallArgs& a) {
  const Value* w = arg(a, 0, "width");
  const std::string pad =
      w && w->is_string() ? w->s : std::string(w ? static_cast<size_t>(w->as_int()) : 4, ' ');
  const bool first = flag(a, 1, "first"), blank = flag(a, 2, "blank");
  s += "\n";
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t e = s.find_first_of("\n\r", pos);
    if (e == std::string::npos) e = s.size();
    lines.push_back(s.substr(pos, e - pos));
    pos = e + (s.compare(e, 2, "\r\n") == 0 ? 2 : 1);
  }
  std::string rv;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k) rv += "\n";
    rv += (k && (blank || !lines[k].empty()) ? pad : "") + lines[k];
  }
  return first ? pad + rv : rv;
}

}  // namespace

const std::map<std::string, Filter>& text_filters() {
  static const std::map<std::string, Filter> table = {
      {"abs",
       [](const Value& v, const CallArgs&) {
         if (v.kind == Value::Kind::Float) return Value::number(std::fabs(v.f));
         if (!v.is_int())
           throw TemplateError(std::string("bad operand type for abs(): '") + type_name(v) + "'");
         if (v.as_int() == INT64_MIN) throw TemplateError("integer overflow in abs");
         return Value::integer(std::llabs(v.as_int()));
       }},
      {"capitalize",
       [](const Value& v, const CallArgs&) { return keep_markup(v, py_capitalize(to_str(v))); }},
      {"center",
       [](const Value& v, const CallArgs& a) {
         const std::string s = to_str(v);
         const int64_t width = arg(a, 0, "width") ? arg(a, 0, "width")->as_int() : 80;
         const int64_t n = static_cast<int64_t>(tok::count_codepoints(s));
         if (width <= n) return Value::string(s);
         const int64_t pad = width - n, left = pad / 2 + (pad & width & 1);
         return Value::string(std::string(left, ' ') + s + std::string(pad - left, ' '));
       }},
      {"escape",
       [](const Value& v, const CallArgs&) {
         return v.markup ? v : Value::make_markup(html_escape(to_str(v)));
       }},
      {"float",
       [](const Value& v, const CallArgs& a) {
         if (v.is_number()) return Value::number(v.as_double());
         if (v.is_string()) {
           try {
             size_t used = 0;
             const std::string t = py_strip(v.s, nullptr, true, true);
             const double d = std::stod(t, &used);
             if (used == t.size()) return Value::number(d);
           } catch (const std::exception&) {
           }
         }
         const Value* d = arg(a, 0, "default");
         return d ? *d : Value::number(0.0);
       }},
      {"format",
       [](const Value& v, const CallArgs& a) {
         return Value::string(percent_format(to_str(v), Value::make_list(a.positional)));
       }},
      {"indent",
       [](const Value& v, const CallArgs& a) { return Value::string(indent(to_str(v), a)); }},
      {"int",
       [](const Value& v, const CallArgs& a) {
         if (v.is_int()) return Value::integer(v.as_int());
         if (v.kind == Value::Kind::Float) return Value::integer(v.as_int());
         if (v.is_string()) {
           const std::string t = py_strip(v.s, nullptr, true, true);
           const int base = arg(a, 1, "base") ? static_cast<int>(arg(a, 1, "base")->as_int()) : 10;
           try {
             size_t used = 0;
             const long long n = std::stoll(t, &used, base);
             if (used == t.size()) return Value::integer(n);
             const double d = std::stod(t, &used);
             if (used == t.size()) return Value::integer(Value::number(d).as_int());
           } catch (const std::exception&) {
           }
         }
         const Value* d = arg(a, 0, "default");
         return d ? *d : Value::integer(0);
       }},
      {"lower",
       [](const Value& v, const CallArgs&) { return keep_markup(v, py_lower(to_str(v))); }},
      {"replace",
       [](const Value& v, const CallArgs& a) {
         CallArgs b = a;
         return get_attr(Value::string(to_str(v)), "replace").fn->fn(b);
       }},
      {"round",
       [](const Value& v, const CallArgs& a) {
         const int64_t p = arg(a, 0, "precision") ? arg(a, 0, "precision")->as_int() : 0;
         const std::string method = str_arg(a, 1, "method", "common");
         const double scale = std::pow(10.0, static_cast<double>(p)), x = v.as_double() * scale;
         double r = method == "ceil"    ? std::ceil(x)
                    : method == "floor" ? std::floor(x)
                                        : std::nearbyint(x);
         if (method == "common" && v.is_int() && p >= 0) return Value::integer(v.as_int());
         return Value::number(r / scale);
       }},
      {"safe",
       [](const Value& v, const CallArgs&) {
         return v.is_string() ? Value::make_markup(v.s) : Value::make_markup(to_str(v));
       }},
      {"string",
       [](const Value& v, const CallArgs&) { return v.markup ? v : Value::string(to_str(v)); }},
      {"title",
       [](const Value& v, const CallArgs&) {
         // jinja2 capitalizes each run after whitespace, '-', '(', '{', '[' or '<'.
         const std::string s = to_str(v);
         std::string out, word;
         const auto flush = [&] {
           if (!word.empty()) out += py_capitalize(word);
           word.clear();
         };
         for (const auto& c : utf8_chars(s)) {
           const bool sep =
               c.size() == 1 && std::string(" \t\n\r\f\v-({[<").find(c[0]) != std::string::npos;
           if (sep)
             flush(), out += c;
           else
             word += c;
         }
         flush();
         return Value::string(out);
       }},
      {"tojson",
       [](const Value& v, const CallArgs& a) {
         JsonDumpOptions opt;
         opt.ensure_ascii = flag(a, 0, "ensure_ascii");
         const Value* ind = arg(a, 1, "indent");
         if (ind && !ind->is_none()) {
           opt.indent = static_cast<int>(ind->as_int());
           opt.item_sep.resize(1);  // ", " -> "," (json.dumps with indent)
         }
         const Value* seps = arg(a, 2, "separators");
         if (seps && seps->is_list() && seps->list->size() == 2) {
           opt.item_sep = to_str((*seps->list)[0]);
           opt.key_sep = to_str((*seps->list)[1]);
         }
         opt.sort_keys = flag(a, 3, "sort_keys");
         return Value::string(json_dumps(v, opt));
       }},
      {"trim",
       [](const Value& v, const CallArgs& a) {
         return keep_markup(v, py_strip(to_str(v), arg(a, 0, "chars"), true, true));
       }},
      {"truncate",
       [](const Value& v, const CallArgs& a) {
         const std::string s = to_str(v);
         const int64_t len = arg(a, 0, "length") ? arg(a, 0, "length")->as_int() : 255;
         const std::string end = str_arg(a, 2, "end", "...");
         const int64_t leeway = arg(a, 3, "leeway") ? arg(a, 3, "leeway")->as_int() : 5;
         const auto chars = utf8_chars(s);
         if (static_cast<int64_t>(chars.size()) <= len + leeway) return Value::string(s);
         std::string head;
         const int64_t keep =
             std::max<int64_t>(0, len - static_cast<int64_t>(tok::count_codepoints(end)));
         for (int64_t k = 0; k < keep && k < static_cast<int64_t>(chars.size()); ++k)
           head += chars[k];
         if (!flag(a, 1, "killwords")) {
           const size_t sp = head.rfind(' ');
           if (sp != std::string::npos) head.resize(sp);
         }
         return Value::string(head + end);
       }},
      {"upper",
       [](const Value& v, const CallArgs&) { return keep_markup(v, py_upper(to_str(v))); }},
      {"wordcount",
       [](const Value& v, const CallArgs&) {
         const std::string s = to_str(v);
         int64_t n = 0;
         bool in_word = false;
         for (size_t i = 0; i < s.size();) {
           const char32_t c = tok::next_codepoint(s, i);
           const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
           const bool w =
               c == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
               tok::is_numeric(c) || cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC;
           if (w && !in_word) ++n;
           in_word = w;
         }
         return Value::integer(n);
       }},
  };
  return table;
}

}  // namespace filter_detail

std::string percent_format(const std::string& fmt, const Value& args) {
  std::string out;
  const bool seq = args.is_list();
  size_t next = 0;
  const auto take = [&]() -> Value {
    if (!seq) {
      if (next++ > 0) throw TemplateError("not enough arguments for format string");
      return args;
    }
    if (next >= args.list->size()) throw TemplateError("not enough arguments for format string");
    return (*args.list)[next++];
  };
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    size_t j = i + 1;
    Value named;
    bool have_named = false;
    if (j < fmt.size() && fmt[j] == '(') {
      const size_t close = fmt.find(')', j);
      if (close == std::string::npos || !args.is_dict())
        throw TemplateError("format requires a mapping");
      named = get_item(args, Value::string(fmt.substr(j + 1, close - j - 1)));
      have_named = true;
      j = close + 1;
    }
    const size_t spec_start = j;
    while (j < fmt.size() && std::string("-+ #0123456789.").find(fmt[j]) != std::string::npos) ++j;
    if (j >= fmt.size()) throw TemplateError("incomplete format");
    const std::string spec = fmt.substr(spec_start, j - spec_start);
    const char conv = fmt[j];
    i = j;
    if (conv == '%') {
      out += '%';
      continue;
    }
    const Value v = have_named ? named : take();
    char buf[512];
    switch (conv) {
      case 's':
      case 'r': {
        const std::string s = conv == 's' ? to_str(v) : to_repr(v);
        std::snprintf(buf, sizeof(buf), ("%" + spec + "s").c_str(), s.c_str());
        out += spec.empty() ? s : std::string(buf);
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o':
        if (!v.is_number())
          throw TemplateError(std::string("%") + conv + " format: a real number is required, not " +
                              type_name(v));
        std::snprintf(
            buf, sizeof(buf), ("%" + spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(),
            static_cast<long long>(v.is_int() ? v.as_int()
                                              : Value::number(std::trunc(v.as_double())).as_int()));
        out += buf;
        break;
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
        if (!v.is_number())
          throw TemplateError(std::string("must be real number, not ") + type_name(v));
        std::snprintf(buf, sizeof(buf), ("%" + spec + conv).c_str(), v.as_double());
        out += buf;
        break;
      case 'c':
        out += v.is_string() ? v.s : std::string(1, static_cast<char>(v.as_int()));
        break;
      default:
        throw TemplateError(std::string("unsupported format character '") + conv + "'");
    }
  }
  if (seq && next < args.list->size())
    throw TemplateError("not all arguments converted during string formatting");
  return out;
}

}  // namespace lmx::chat
