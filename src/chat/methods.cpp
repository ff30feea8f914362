// Attribute/item lookup, dict/list methods and the template globals.
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <ctime>

#include "chat/builtins.h"
#include "chat/template_error.h"
#include "tokenizer/unicode.h"

namespace lmx::chat {

namespace {
const char* kUnsafeList[] = {"append", "extend",  "insert", "pop",
                             "remove", "reverse", "sort",   "clear"};
const char* kUnsafeDict[] = {"update", "pop", "popitem", "setdefault", "clear"};

template <size_t N>
bool among(const char* (&names)[N], const std::string& n) {
  for (const char* x : names)
    if (n == x) return true;
  return false;
}

Value dict_items(const Value& d) {
  List out;
  for (const auto& [k, v] : d.dict->entries)
    out.push_back(Value::make_tuple({d.dict->key_value(k), v}));
  return Value::make_list(std::move(out));
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined())
    throw TemplateError(obj.s.empty() ? "'" + name + "' of an undefined value" : obj.s);
  if (obj.is_string() && is_str_method(name)) {
    const std::string s = obj.s;
    const bool markup = obj.markup;
    return Value::function(name, [s, name, markup](const CallArgs& a) {
      Value r = str_method(s, name, a);
      // Markup's strip/upper/lower/title/capitalize return Markup.
      if (markup && r.is_string() && name != "format" && name != "join" && name != "replace")
        r.markup = true;
      return r;
    });
  }
  if (obj.is_dict() && !obj.dict->is_namespace) {
    if (name == "items" || name == "keys" || name == "values" || name == "get" || name == "copy") {
      Value d = obj;
      return Value::function(name, [d, name](const CallArgs& a) -> Value {
        if (name == "items") return dict_items(d);
        if (name == "copy") {
          Value c = Value::make_dict();
          *c.dict = *d.dict;
          return c;
        }
        if (name == "get") {
          const Value* k = a.get(0, "\x01");
          if (!k) throw TemplateError("get expected at least 1 argument, got 0");
          const Value* v = d.dict->find(Dict::encode_key(*k));
          const Value* fallback = a.get(1, "\x01");
          return v ? *v : fallback ? *fallback : Value::none();
        }
        List out;
        for (const auto& [k, v] : d.dict->entries)
          out.push_back(name == "keys" ? d.dict->key_value(k) : v);
        return Value::make_list(std::move(out));
      });
    }
    if (among(kUnsafeDict, name))
      throw TemplateError("access to attribute '" + name + "' of 'dict' object is unsafe.");
  }
  if (obj.is_dict()) {
    if (const Value* v = obj.dict->find(name)) return *v;
    return Value::undefined(std::string("'") +
                            std::string(obj.dict->is_namespace ? "Namespace" : "dict") +
                            " object' has no attribute '" + name + "'");
  }
  if (obj.is_list()) {
    if (among(kUnsafeList, name))
      throw TemplateError("access to attribute '" + name + "' of 'list' object is unsafe.");
    if (name == "count" || name == "index") {
      Value l = obj;
      return Value::function(name, [l, name](const CallArgs& a) -> Value {
        const Value* x = a.get(0, "\x01");
        if (!x) throw TemplateError(name + "() takes exactly one argument");
        int64_t n = 0;
        for (size_t k = 0; k < l.list->size(); ++k)
          if (equal((*l.list)[k], *x)) {
            if (name == "index") return Value::integer(static_cast<int64_t>(k));
            ++n;
          }
        if (name == "index") throw TemplateError(to_repr(*x) + " is not in list");
        return Value::integer(n);
      });
    }
  }
  return Value::undefined(std::string("'") + std::string(type_name(obj)) +
                          " object' has no attribute '" + name + "'");
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined())
    throw TemplateError(obj.s.empty() ? "undefined value has no items" : obj.s);
  if (obj.is_list() && obj.generator)
    throw TemplateError("'generator' object is not subscriptable");
  if (obj.is_dict()) {
    if (const Value* v = obj.dict->find(Dict::encode_key(key))) return *v;
  } else if ((obj.is_list() || obj.is_string()) && key.is_int()) {
    const int64_t n = length(obj);
    int64_t k = key.as_int();
    if (k < 0) k += n;
    if (k >= 0 && k < n) {
      if (obj.is_list()) return (*obj.list)[static_cast<size_t>(k)];
      return Value::string(utf8_chars(obj.s)[static_cast<size_t>(k)]);
    }
    return Value::undefined(std::string("'") + std::string(type_name(obj)) +
                            " object' has no element " + to_str(key));
  }
  if (key.is_string()) return get_attr(obj, key.s);
  return Value::undefined(std::string("'") + std::string(type_name(obj)) +
                          " object' has no element " + to_repr(key));
}

Value slice(const Value& obj, const Value* start, const Value* stop, const Value* step) {
  if (obj.is_undefined())
    throw TemplateError(obj.s.empty() ? "undefined value has no items" : obj.s);
  if (obj.is_list() && obj.generator)
    throw TemplateError("'generator' object is not subscriptable");
  const auto given = [](const Value* v) { return v && !v->is_none(); };
  const int64_t st = given(step) ? step->as_int() : 1;
  if (st == 0) throw TemplateError("slice step cannot be zero");
  const int64_t n = length(obj);
  const auto clamp = [&](const Value* v, int64_t def) {
    if (!given(v)) return def;
    int64_t k = v->as_int();
    if (k < 0) k += n;
    if (st > 0) return std::clamp<int64_t>(k, 0, n);
    return std::clamp<int64_t>(k, -1, n - 1);
  };
  const int64_t b = clamp(start, st > 0 ? 0 : n - 1), e = clamp(stop, st > 0 ? n : -1);
  std::vector<int64_t> idx;
  for (int64_t k = b; st > 0 ? k < e : k > e; k += st) idx.push_back(k);
  if (obj.is_string()) {
    const auto chars = utf8_chars(obj.s);
    std::string out;
    for (int64_t k : idx) out += chars[static_cast<size_t>(k)];
    return Value::string(out);
  }
  if (!obj.is_list())
    throw TemplateError(std::string("'") + type_name(obj) + "' object is not subscriptable");
  List out;
  for (int64_t k : idx) out.push_back((*obj.list)[static_cast<size_t>(k)]);
  return Value::make_list(std::move(out));
}

Value global(const std::string& name) {
  if (name == "range")
    return Value::function("range", [](const CallArgs& a) {
      int64_t b = 0, e = 0, st = 1;
      if (a.positional.size() == 1)
        e = a.positional[0].as_int();
      else if (a.positional.size() >= 2) {
        b = a.positional[0].as_int();
        e = a.positional[1].as_int();
        if (a.positional.size() > 2) st = a.positional[2].as_int();
      } else
        throw TemplateError("range expected at least 1 argument, got 0");
      if (st == 0) throw TemplateError("range() arg 3 must not be zero");
      List out;
      for (int64_t k = b; st > 0 ? k < e : k > e; k += st) {
        if (out.size() >= 100000)
          throw TemplateError(
              "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        out.push_back(Value::integer(k));
      }
      return Value::make_list(std::move(out));
    });
  if (name == "namespace" || name == "dict")
    return Value::function(name, [name](const CallArgs& a) {
      Value d = Value::make_dict();
      d.dict->is_namespace = name == "namespace";
      for (const auto& p : a.positional) {
        if (!p.is_dict()) throw TemplateError(name + "() positional argument must be a dict");
        d.dict->entries = p.dict->entries;
        d.dict->odd_keys = p.dict->odd_keys;
      }
      for (const auto& [k, v] : a.keyword) d.dict->set(k, v);
      return d;
    });
  if (name == "raise_exception")
    return Value::function(name, [](const CallArgs& a) -> Value {
      throw TemplateError(a.positional.empty() ? "" : to_str(a.positional[0]));
    });
  if (name == "strftime_now")
    return Value::function(name, [](const CallArgs& a) {
      // SOURCE_DATE_EPOCH (reproducible-builds.org): a fixed time, in UTC, so that a render is
      // reproducible (the template tests render at their fixtures' time).
      std::tm tm{};
      if (const char* fixed = std::getenv("SOURCE_DATE_EPOCH")) {
        char* end = nullptr;
        errno = 0;
        const long long secs = std::strtoll(fixed, &end, 10);
        if (*fixed == '\0' || *end != '\0' || errno == ERANGE)
          throw TemplateError(std::string("strftime_now: SOURCE_DATE_EPOCH must be an integer "
                                          "number of seconds, got '") +
                              fixed + "'");
        const auto t = static_cast<std::time_t>(secs);
        gmtime_r(&t, &tm);
      } else {
        const std::time_t t = std::time(nullptr);
        localtime_r(&t, &tm);
      }
      char buf[256];
      const std::string fmt = a.positional.empty() ? "" : to_str(a.positional[0]);
      const size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
      return Value::string(std::string(buf, n));
    });
  if (name == "joiner")
    return Value::function(name, [](const CallArgs& a) {
      const std::string sep = a.positional.empty() ? ", " : to_str(a.positional[0]);
      auto used = std::make_shared<bool>(false);
      return Value::function("joiner", [sep, used](const CallArgs&) {
        if (!*used) {
          *used = true;
          return Value::string("");
        }
        return Value::string(sep);
      });
    });
  return Value::undefined("'" + name + "' is undefined");
}

}  // namespace lmx::chat
