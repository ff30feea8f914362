// jinja2's built-in filters and tests (jinja2/filters.py, jinja2/tests.py) with transformers'
// tojson (json.dumps with ensure_ascii=False and no HTML escaping).
#include <cmath>
#include <cstdio>
#include <map>
#include <utf8proc.h>

#include "chat/builtins.h"
#include "chat/template_error.h"
#include "tokenizer/unicode.h"

namespace lmx::chat {

namespace {

using Filter = Value (*)(const Value&, const CallArgs&);

const Value* arg(const CallArgs& a, size_t i, const char* name) { return a.get(i, name); }
bool flag(const CallArgs& a, size_t i, const char* name, bool fallback = false) {
  const Value* v = a.get(i, name);
  return v ? truthy(*v) : fallback;
}
std::string str_arg(const CallArgs& a, size_t i, const char* name, const std::string& fallback) {
  const Value* v = a.get(i, name);
  return v && !v->is_none() ? to_str(*v) : fallback;
}

// Sort/compare key: lowercased strings unless case_sensitive (jinja2's ignore_case).
Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value::string(py_lower(v.s)) : v;
}

Value items_of(const Value& v) {
  if (v.is_undefined()) return Value::make_list();
  if (!v.is_dict()) throw TemplateError(std::string("Can only get item pairs from a mapping, not ") + type_name(v));
  return get_attr(v, "items").fn->fn({});
}

List with_attribute(const List& items, const Value* attribute) {
  if (!attribute || attribute->is_none()) return items;
  List out;
  for (const auto& x : items) out.push_back(attribute_path(x, to_str(*attribute)));
  return out;
}

// Filters that run str methods on soft_str(value) return Markup for Markup input.
Value keep_markup(const Value& in, std::string out) {
  Value v = Value::string(std::move(out));
  v.markup = in.markup;
  return v;
}

Value select_like(const Value& v, const CallArgs& a, bool by_attr, bool keep) {
  List out;
  const size_t test_at = by_attr ? 1 : 0;
  const Value* attr = by_attr ? arg(a, 0, "\x01") : nullptr;
  if (by_attr && !attr) throw TemplateError("selectattr/rejectattr need an attribute name");
  const Value* test = arg(a, test_at, "\x01");
  CallArgs targs;
  for (size_t k = test_at + 1; k < a.positional.size(); ++k) targs.positional.push_back(a.positional[k]);
  if (!truthy(v)) return Value::make_generator({});  // jinja2's select_or_reject: `if value:`
  for (const auto& item : iterate(v)) {
    const Value x = attr ? attribute_path(item, to_str(*attr)) : item;
    const bool ok = test ? apply_test(to_str(*test), x, targs) : truthy(x);
    if (ok == keep) out.push_back(item);
  }
  return Value::make_generator(std::move(out));
}

Value min_max(const Value& v, const CallArgs& a, bool want_max) {
  const List items = iterate(v);
  const bool cs = flag(a, 0, "case_sensitive");
  const List keys = with_attribute(items, arg(a, 1, "attribute"));
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  for (size_t k = 1; k < items.size(); ++k) {
    const bool better = want_max ? less(sort_key(keys[best], cs), sort_key(keys[k], cs))
                                 : less(sort_key(keys[k], cs), sort_key(keys[best], cs));
    if (better) best = k;
  }
  return items[best];
}

std::string indent(std::string s, const CallArgs& a) {
  const Value* w = arg(a, 0, "width");
  const std::string pad = w && w->is_string() ? w->s : std::string(w ? static_cast<size_t>(w->as_int()) : 4, ' ');
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

const std::map<std::string, Filter>& filters() {
  static const std::map<std::string, Filter> table = {
      {"abs", [](const Value& v, const CallArgs&) {
         if (v.kind == Value::Kind::Float) return Value::number(std::fabs(v.f));
         if (!v.is_int()) throw TemplateError(std::string("bad operand type for abs(): '") + type_name(v) + "'");
         return Value::integer(std::llabs(v.as_int()));
       }},
      {"attr", [](const Value& v, const CallArgs& a) { return get_attr(v, str_arg(a, 0, "name", "")); }},
      {"batch", [](const Value& v, const CallArgs& a) {
         const int64_t n = arg(a, 0, "linecount") ? arg(a, 0, "linecount")->as_int() : 1;
         const Value* fill = arg(a, 1, "fill_with");
         List out, cur;
         for (const auto& x : iterate(v)) {
           cur.push_back(x);
           if (static_cast<int64_t>(cur.size()) == n) out.push_back(Value::make_list(std::move(cur))), cur.clear();
         }
         if (!cur.empty()) {
           while (fill && !fill->is_none() && static_cast<int64_t>(cur.size()) < n) cur.push_back(*fill);
           out.push_back(Value::make_list(std::move(cur)));
         }
         return Value::make_generator(std::move(out));
       }},
      {"capitalize", [](const Value& v, const CallArgs&) { return keep_markup(v, py_capitalize(to_str(v))); }},
      {"center", [](const Value& v, const CallArgs& a) {
         const std::string s = to_str(v);
         const int64_t width = arg(a, 0, "width") ? arg(a, 0, "width")->as_int() : 80;
         const int64_t n = static_cast<int64_t>(tok::count_codepoints(s));
         if (width <= n) return Value::string(s);
         const int64_t pad = width - n, left = pad / 2 + (pad & width & 1);
         return Value::string(std::string(left, ' ') + s + std::string(pad - left, ' '));
       }},
      {"count", [](const Value& v, const CallArgs&) { return Value::integer(length(v)); }},
      {"default", [](const Value& v, const CallArgs& a) {
         const bool boolean = flag(a, 1, "boolean");
         if (v.is_undefined() || (boolean && !truthy(v))) {
           const Value* d = arg(a, 0, "default_value");
           return d ? *d : Value::string("");
         }
         return v;
       }},
      {"dictsort", [](const Value& v, const CallArgs& a) {
         Value items = items_of(v);
         const bool cs = flag(a, 0, "case_sensitive");
         const std::string by = str_arg(a, 1, "by", "key");
         const size_t pos = by == "value" ? 1 : 0;
         if (by != "key" && by != "value") throw TemplateError("You can only sort by either 'key' or 'value'");
         std::stable_sort(items.list->begin(), items.list->end(), [&](const Value& x, const Value& y) {
           return less(sort_key((*x.list)[pos], cs), sort_key((*y.list)[pos], cs));
         });
         if (flag(a, 2, "reverse")) std::reverse(items.list->begin(), items.list->end());
         return items;
       }},
      {"escape", [](const Value& v, const CallArgs&) {
         return v.markup ? v : Value::make_markup(html_escape(to_str(v)));
       }},
      {"first", [](const Value& v, const CallArgs&) {
         const List items = iterate(v);
         return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
       }},
      {"float", [](const Value& v, const CallArgs& a) {
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
      {"format", [](const Value& v, const CallArgs& a) {
         return Value::string(percent_format(to_str(v), Value::make_list(a.positional)));
       }},
      {"indent", [](const Value& v, const CallArgs& a) { return Value::string(indent(to_str(v), a)); }},
      {"int", [](const Value& v, const CallArgs& a) {
         if (v.is_int()) return Value::integer(v.as_int());
         if (v.kind == Value::Kind::Float) return Value::integer(static_cast<int64_t>(v.f));
         if (v.is_string()) {
           const std::string t = py_strip(v.s, nullptr, true, true);
           const int base = arg(a, 1, "base") ? static_cast<int>(arg(a, 1, "base")->as_int()) : 10;
           try {
             size_t used = 0;
             const long long n = std::stoll(t, &used, base);
             if (used == t.size()) return Value::integer(n);
             const double d = std::stod(t, &used);
             if (used == t.size()) return Value::integer(static_cast<int64_t>(d));
           } catch (const std::exception&) {
           }
         }
         const Value* d = arg(a, 0, "default");
         return d ? *d : Value::integer(0);
       }},
      {"items", [](const Value& v, const CallArgs&) { return Value::make_generator(*items_of(v).list); }},
      {"join", [](const Value& v, const CallArgs& a) {
         const std::string sep = str_arg(a, 0, "d", "");
         std::string out;
         bool first = true;
         for (const auto& x : with_attribute(iterate(v), arg(a, 1, "attribute"))) {
           if (!first) out += sep;
           first = false;
           out += to_str(x);
         }
         return Value::string(out);
       }},
      {"last", [](const Value& v, const CallArgs&) {
         const List items = iterate(v);
         return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
       }},
      {"length", [](const Value& v, const CallArgs&) { return Value::integer(length(v)); }},
      {"list", [](const Value& v, const CallArgs&) { return Value::make_list(iterate(v)); }},
      {"lower", [](const Value& v, const CallArgs&) { return keep_markup(v, py_lower(to_str(v))); }},
      {"map", [](const Value& v, const CallArgs& a) {
         List out;
         const Value* attribute = a.get(static_cast<size_t>(-1), "attribute");
         const Value* fallback = a.get(static_cast<size_t>(-1), "default");
         CallArgs fargs;
         for (size_t k = 1; k < a.positional.size(); ++k) fargs.positional.push_back(a.positional[k]);
         if (!truthy(v)) return Value::make_generator({});  // do_map: `if value:`
         for (const auto& x : iterate(v)) {
           if (attribute) {
             Value y = attribute_path(x, to_str(*attribute));
             out.push_back(y.is_undefined() && fallback ? *fallback : y);
           } else if (!a.positional.empty()) {
             out.push_back(apply_filter(to_str(a.positional[0]), x, fargs));
           } else {
             out.push_back(x);
           }
         }
         return Value::make_generator(std::move(out));
       }},
      {"max", [](const Value& v, const CallArgs& a) { return min_max(v, a, true); }},
      {"min", [](const Value& v, const CallArgs& a) { return min_max(v, a, false); }},
      {"reject", [](const Value& v, const CallArgs& a) { return select_like(v, a, false, false); }},
      {"rejectattr", [](const Value& v, const CallArgs& a) { return select_like(v, a, true, false); }},
      {"replace", [](const Value& v, const CallArgs& a) {
         CallArgs b = a;
         return get_attr(Value::string(to_str(v)), "replace").fn->fn(b);
       }},
      {"reverse", [](const Value& v, const CallArgs&) {
         if (v.is_string()) {
           auto chars = utf8_chars(v.s);
           std::string out;
           for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
           return Value::string(out);
         }
         List items = iterate(v);
         std::reverse(items.begin(), items.end());
         return Value::make_generator(std::move(items));  // reversed(): an iterator
       }},
      {"round", [](const Value& v, const CallArgs& a) {
         const int64_t p = arg(a, 0, "precision") ? arg(a, 0, "precision")->as_int() : 0;
         const std::string method = str_arg(a, 1, "method", "common");
         const double scale = std::pow(10.0, static_cast<double>(p)), x = v.as_double() * scale;
         double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
         if (method == "common" && v.is_int() && p >= 0) return Value::integer(v.as_int());
         return Value::number(r / scale);
       }},
      {"safe", [](const Value& v, const CallArgs&) {
         return v.is_string() ? Value::make_markup(v.s) : Value::make_markup(to_str(v));
       }},
      {"select", [](const Value& v, const CallArgs& a) { return select_like(v, a, false, true); }},
      {"selectattr", [](const Value& v, const CallArgs& a) { return select_like(v, a, true, true); }},
      {"sort", [](const Value& v, const CallArgs& a) {
         List items = iterate(v);
         const bool cs = flag(a, 1, "case_sensitive");
         const List keys = with_attribute(items, arg(a, 2, "attribute"));
         std::vector<size_t> order(items.size());
         for (size_t k = 0; k < order.size(); ++k) order[k] = k;
         std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
           return less(sort_key(keys[x], cs), sort_key(keys[y], cs));
         });
         if (flag(a, 0, "reverse")) std::reverse(order.begin(), order.end());
         List out;
         for (size_t k : order) out.push_back(items[k]);
         return Value::make_list(std::move(out));
       }},
      {"string", [](const Value& v, const CallArgs&) { return v.markup ? v : Value::string(to_str(v)); }},
      {"sum", [](const Value& v, const CallArgs& a) {
         Value total = arg(a, 1, "start") ? *arg(a, 1, "start") : Value::integer(0);
         for (const auto& x : with_attribute(iterate(v), arg(a, 0, "attribute"))) {
           if (!x.is_number() || !total.is_number()) throw TemplateError("unsupported operand type(s) for +");
           total = total.is_int() && x.is_int() ? Value::integer(total.as_int() + x.as_int())
                                                : Value::number(total.as_double() + x.as_double());
         }
         return total;
       }},
      {"title", [](const Value& v, const CallArgs&) {
         // jinja2 capitalizes each run after whitespace, '-', '(', '{', '[' or '<'.
         const std::string s = to_str(v);
         std::string out, word;
         const auto flush = [&] {
           if (!word.empty()) out += py_capitalize(word);
           word.clear();
         };
         for (const auto& c : utf8_chars(s)) {
           const bool sep = c.size() == 1 && std::string(" \t\n\r\f\v-({[<").find(c[0]) != std::string::npos;
           if (sep) flush(), out += c;
           else word += c;
         }
         flush();
         return Value::string(out);
       }},
      {"tojson", [](const Value& v, const CallArgs& a) {
         JsonDumpOptions opt;
         opt.ensure_ascii = flag(a, 0, "ensure_ascii");
         const Value* ind = arg(a, 1, "indent");
         if (ind && !ind->is_none()) {
           opt.indent = static_cast<int>(ind->as_int());
           opt.item_sep = ",";
         }
         const Value* seps = arg(a, 2, "separators");
         if (seps && seps->is_list() && seps->list->size() == 2) {
           opt.item_sep = to_str((*seps->list)[0]);
           opt.key_sep = to_str((*seps->list)[1]);
         }
         opt.sort_keys = flag(a, 3, "sort_keys");
         return Value::string(json_dumps(v, opt));
       }},
      {"trim", [](const Value& v, const CallArgs& a) {
         return keep_markup(v, py_strip(to_str(v), arg(a, 0, "chars"), true, true));
       }},
      {"truncate", [](const Value& v, const CallArgs& a) {
         const std::string s = to_str(v);
         const int64_t len = arg(a, 0, "length") ? arg(a, 0, "length")->as_int() : 255;
         const std::string end = str_arg(a, 2, "end", "...");
         const int64_t leeway = arg(a, 3, "leeway") ? arg(a, 3, "leeway")->as_int() : 5;
         const auto chars = utf8_chars(s);
         if (static_cast<int64_t>(chars.size()) <= len + leeway) return Value::string(s);
         std::string head;
         const int64_t keep = std::max<int64_t>(0, len - static_cast<int64_t>(tok::count_codepoints(end)));
         for (int64_t k = 0; k < keep && k < static_cast<int64_t>(chars.size()); ++k) head += chars[k];
         if (!flag(a, 1, "killwords")) {
           const size_t sp = head.rfind(' ');
           if (sp != std::string::npos) head.resize(sp);
         }
         return Value::string(head + end);
       }},
      {"unique", [](const Value& v, const CallArgs& a) {
         const List items = iterate(v);
         const bool cs = flag(a, 0, "case_sensitive");
         const List keys = with_attribute(items, arg(a, 1, "attribute"));
         List out, seen;
         for (size_t k = 0; k < items.size(); ++k) {
           const Value key = sort_key(keys[k], cs);
           if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) continue;
           seen.push_back(key);
           out.push_back(items[k]);
         }
         return Value::make_generator(std::move(out));
       }},
      {"upper", [](const Value& v, const CallArgs&) { return keep_markup(v, py_upper(to_str(v))); }},
      {"wordcount", [](const Value& v, const CallArgs&) {
         const std::string s = to_str(v);
         int64_t n = 0;
         bool in_word = false;
         for (size_t i = 0; i < s.size();) {
           const char32_t c = tok::next_codepoint(s, i);
           const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
           const bool w = c == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                          tok::is_numeric(c) || cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC;
           if (w && !in_word) ++n;
           in_word = w;
         }
         return Value::integer(n);
       }},
  };
  return table;
}

const std::map<std::string, std::string>& filter_aliases() {
  static const std::map<std::string, std::string> a = {{"d", "default"}, {"e", "escape"}, {"forceescape", "escape"}};
  return a;
}

}  // namespace

bool has_filter(const std::string& name) {
  return filters().count(name) || filter_aliases().count(name);
}

Value apply_filter(const std::string& name, const Value& v, const CallArgs& args) {
  auto alias = filter_aliases().find(name);
  const std::string& real = alias == filter_aliases().end() ? name : alias->second;
  auto it = filters().find(real);
  if (it == filters().end()) throw TemplateError("No filter named '" + name + "'.");
  return it->second(v, args);
}

Value attribute_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = get_item(cur, digits ? Value::integer(std::stoll(part)) : Value::string(part));
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

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
      if (close == std::string::npos || !args.is_dict()) throw TemplateError("format requires a mapping");
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
      case 's': case 'r': {
        const std::string s = conv == 's' ? to_str(v) : to_repr(v);
        std::snprintf(buf, sizeof(buf), ("%" + spec + "s").c_str(), s.c_str());
        out += spec.empty() ? s : std::string(buf);
        break;
      }
      case 'd': case 'i': case 'x': case 'X': case 'o':
        if (!v.is_number()) throw TemplateError(std::string("%") + conv + " format: a real number is required, not " + type_name(v));
        std::snprintf(buf, sizeof(buf), ("%" + spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(),
                      static_cast<long long>(v.as_double()));
        out += buf;
        break;
      case 'f': case 'F': case 'e': case 'E': case 'g': case 'G':
        if (!v.is_number()) throw TemplateError(std::string("must be real number, not ") + type_name(v));
        std::snprintf(buf, sizeof(buf), ("%" + spec + conv).c_str(), v.as_double());
        out += buf;
        break;
      case 'c': out += v.is_string() ? v.s : std::string(1, static_cast<char>(v.as_int())); break;
      default: throw TemplateError(std::string("unsupported format character '") + conv + "'");
    }
  }
  if (seq && next < args.list->size()) throw TemplateError("not all arguments converted during string formatting");
  return out;
}

}  // namespace lmx::chat
