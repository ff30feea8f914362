// jinja2's sequence and mapping filters (jinja2/filters.py) and the filter registry; the string
// and number filters are in filters_text.cpp.
#include <utf8proc.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "chat/builtins.h"
#include "chat/filter_args.h"
#include "chat/template_error.h"
#include "tokenizer/unicode.h"

namespace lmx::chat {

using namespace filter_detail;

namespace {

// Sort/compare key: lowercased strings unless case_sensitive (jinja2's ignore_case).
Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value::string(py_lower(v.s)) : v;
}

Value items_of(const Value& v) {
  if (v.is_undefined()) return Value::make_list();
  if (!v.is_dict())
    throw TemplateError(std::string("Can only get item pairs from a mapping, not ") + type_name(v));
  return get_attr(v, "items").fn->fn({});
}

List with_attribute(const List& items, const Value* attribute) {
  if (!attribute || attribute->is_none()) return items;
  List out;
  for (const auto& x : items) out.push_back(attribute_path(x, to_str(*attribute)));
  return out;
}

Value select_like(const Value& v, const CallArgs& a, bool by_attr, bool keep) {
  List out;
  const size_t test_at = by_attr ? 1 : 0;
  const Value* attr = by_attr ? arg(a, 0, "\x01") : nullptr;
  if (by_attr && !attr) throw TemplateError("selectattr/rejectattr need an attribute name");
  const Value* test = arg(a, test_at, "\x01");
  CallArgs targs;
  for (size_t k = test_at + 1; k < a.positional.size(); ++k)
    targs.positional.push_back(a.positional[k]);
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

const std::map<std::string, Filter>& filters() {
  static const std::map<std::string, Filter> table = {
      {"attr",
       [](const Value& v, const CallArgs& a) { return get_attr(v, str_arg(a, 0, "name", "")); }},
      {"batch",
       [](const Value& v, const CallArgs& a) {
         const int64_t n = arg(a, 0, "linecount") ? arg(a, 0, "linecount")->as_int() : 1;
         const Value* fill = arg(a, 1, "fill_with");
         List out, cur;
         for (const auto& x : iterate(v)) {
           cur.push_back(x);
           if (static_cast<int64_t>(cur.size()) == n)
             out.push_back(Value::make_list(std::move(cur))), cur.clear();
         }
         if (!cur.empty()) {
           while (fill && !fill->is_none() && static_cast<int64_t>(cur.size()) < n)
             cur.push_back(*fill);
           out.push_back(Value::make_list(std::move(cur)));
         }
         return Value::make_generator(std::move(out));
       }},
      {"count", [](const Value& v, const CallArgs&) { return Value::integer(length(v)); }},
      {"default",
       [](const Value& v, const CallArgs& a) {
         const bool boolean = flag(a, 1, "boolean");
         if (v.is_undefined() || (boolean && !truthy(v))) {
           const Value* d = arg(a, 0, "default_value");
           return d ? *d : Value::string("");
         }
         return v;
       }},
      {"dictsort",
       [](const Value& v, const CallArgs& a) {
         Value items = items_of(v);
         const bool cs = flag(a, 0, "case_sensitive");
         const std::string by = str_arg(a, 1, "by", "key");
         const size_t pos = by == "value" ? 1 : 0;
         if (by != "key" && by != "value")
           throw TemplateError("You can only sort by either 'key' or 'value'");
         std::stable_sort(items.list->begin(), items.list->end(),
                          [&](const Value& x, const Value& y) {
                            return less(sort_key((*x.list)[pos], cs), sort_key((*y.list)[pos], cs));
                          });
         if (flag(a, 2, "reverse")) std::reverse(items.list->begin(), items.list->end());
         return items;
       }},
      {"first",
       [](const Value& v, const CallArgs&) {
         const List items = iterate(v);
         return items.empty() ? Value::undefined("No first item, sequence was empty.")
                              : items.front();
       }},
      {"items",
       [](const Value& v, const CallArgs&) { return Value::make_generator(*items_of(v).list); }},
      {"join",
       [](const Value& v, const CallArgs& a) {
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
      {"last",
       [](const Value& v, const CallArgs&) {
         const List items = iterate(v);
         return items.empty() ? Value::undefined("No last item, sequence was empty.")
                              : items.back();
       }},
      {"length", [](const Value& v, const CallArgs&) { return Value::integer(length(v)); }},
      {"list", [](const Value& v, const CallArgs&) { return Value::make_list(iterate(v)); }},
      {"map",
       [](const Value& v, const CallArgs& a) {
         List out;
         const Value* attribute = a.get(static_cast<size_t>(-1), "attribute");
         const Value* fallback = a.get(static_cast<size_t>(-1), "default");
         CallArgs fargs;
         for (size_t k = 1; k < a.positional.size(); ++k)
           fargs.positional.push_back(a.positional[k]);
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
      {"rejectattr",
       [](const Value& v, const CallArgs& a) { return select_like(v, a, true, false); }},
      {"reverse",
       [](const Value& v, const CallArgs&) {
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
      {"select", [](const Value& v, const CallArgs& a) { return select_like(v, a, false, true); }},
      {"selectattr",
       [](const Value& v, const CallArgs& a) { return select_like(v, a, true, true); }},
      {"sort",
       [](const Value& v, const CallArgs& a) {
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
      {"sum",
       [](const Value& v, const CallArgs& a) {
         Value total = arg(a, 1, "start") ? *arg(a, 1, "start") : Value::integer(0);
         for (const auto& x : with_attribute(iterate(v), arg(a, 0, "attribute"))) {
           if (!x.is_number() || !total.is_number())
             throw TemplateError("unsupported operand type(s) for +");
           int64_t r = 0;
           if (total.is_int() && x.is_int() &&
               __builtin_add_overflow(total.as_int(), x.as_int(), &r))
             throw TemplateError("integer overflow in sum");
           total = total.is_int() && x.is_int() ? Value::integer(r)
                                                : Value::number(total.as_double() + x.as_double());
         }
         return total;
       }},
      {"unique",
       [](const Value& v, const CallArgs& a) {
         const List items = iterate(v);
         const bool cs = flag(a, 0, "case_sensitive");
         const List keys = with_attribute(items, arg(a, 1, "attribute"));
         List out, seen;
         for (size_t k = 0; k < items.size(); ++k) {
           const Value key = sort_key(keys[k], cs);
           if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); }))
             continue;
           seen.push_back(key);
           out.push_back(items[k]);
         }
         return Value::make_generator(std::move(out));
       }},
  };
  return table;
}

const std::map<std::string, std::string>& filter_aliases() {
  static const std::map<std::string, std::string> a = {
      {"d", "default"}, {"e", "escape"}, {"forceescape", "escape"}};
  return a;
}

}  // namespace

bool has_filter(const std::string& name) {
  return filters().count(name) || text_filters().count(name) || filter_aliases().count(name);
}

Value apply_filter(const std::string& name, const Value& v, const CallArgs& args) {
  auto alias = filter_aliases().find(name);
  const std::string& real = alias == filter_aliases().end() ? name : alias->second;
  auto it = filters().find(real);
  if (it != filters().end()) return it->second(v, args);
  auto text = text_filters().find(real);
  if (text == text_filters().end()) throw TemplateError("No filter named '" + name + "'.");
  return text->second(v, args);
}

Value attribute_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    const std::string part =
        path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = get_item(
        cur, digits && part.size() < 19 ? Value::integer(std::stoll(part)) : Value::string(part));
    if (dot == std::string::npos) return cur;
    pos = dot + 1;
  }
}

}  // namespace lmx::chat
