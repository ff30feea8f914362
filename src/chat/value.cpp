#include "chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "chat/template_error.h"
#include "tokenizer/unicode.h"

namespace lmx::chat {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : entries)
    if (k == key) {
      old = std::move(v);
      return;
    }
  entries.emplace_back(key, std::move(v));
}

std::string Dict::encode_key(const Value& key) {
  if (key.is_string()) return key.s;
  std::string out(1, '\0');
  if (key.is_number() && key.as_double() == static_cast<double>(key.as_int()))
    return out.append(std::to_string(key.as_int()));
  return out.append(to_repr(key));
}

void Dict::set_key(const Value& key, Value v) {
  const std::string k = encode_key(key);
  if (!key.is_string() && !find(k)) odd_keys.emplace_back(k, key);
  set(k, std::move(v));
}

Value Dict::key_value(const std::string& stored) const {
  if (stored.empty() || stored[0] != '\0') return Value::string(stored);
  for (const auto& [k, v] : odd_keys)
    if (k == stored) return v;
  return Value::string(stored.substr(1));
}

const Value* CallArgs::get(size_t index, std::string_view name) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return index < positional.size() ? &positional[index] : nullptr;
}

Value Value::undefined(std::string hint) {
  Value v;
  v.s = std::move(hint);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::Bool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::Int;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::Float;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::String;
  v.s = std::move(x);
  return v;
}
Value Value::make_list(List items) {
  Value v;
  v.kind = Kind::List;
  v.list = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::make_tuple(List items) {
  Value v = make_list(std::move(items));
  v.tuple = true;
  return v;
}
Value Value::make_generator(List items) {
  Value v = make_list(std::move(items));
  v.generator = true;
  return v;
}
Value Value::make_markup(std::string s) {
  Value v = string(std::move(s));
  v.markup = true;
  return v;
}
Value Value::make_dict() {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<Dict>();
  return v;
}
Value Value::function(std::string name, std::function<Value(const CallArgs&)> fn) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

double Value::as_double() const {
  if (kind == Kind::Float) return f;
  return static_cast<double>(as_int());
}
int64_t Value::as_int() const {
  if (kind == Kind::Bool) return b ? 1 : 0;
  if (kind == Kind::Float) {
    // 2^63 as a double; beyond it (and for nan) the cast is undefined.
    if (!(std::fabs(f) < 9223372036854775808.0))
      throw TemplateError("cannot convert " + py_float_repr(f) + " to a 64-bit integer");
    return static_cast<int64_t>(f);
  }
  return i;
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
      return "Undefined";
    case Value::Kind::None:
      return "NoneType";
    case Value::Kind::Bool:
      return "bool";
    case Value::Kind::Int:
      return "int";
    case Value::Kind::Float:
      return "float";
    case Value::Kind::String:
      return "str";
    case Value::Kind::List:
      return v.generator ? "generator" : v.tuple ? "tuple" : "list";
    case Value::Kind::Dict:
      return v.dict->is_namespace ? "Namespace" : "dict";
    case Value::Kind::Callable:
      return v.fn->is_macro ? "Macro" : "function";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return false;
    case Value::Kind::Bool:
      return v.b;
    case Value::Kind::Int:
      return v.i != 0;
    case Value::Kind::Float:
      return v.f != 0;
    case Value::Kind::String:
      return !v.s.empty();
    case Value::Kind::List:
      return v.generator || !v.list->empty();
    case Value::Kind::Dict:
      return v.dict->is_namespace || !v.dict->entries.empty();
    case Value::Kind::Callable:
      return true;
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Kind::Float || b.kind == Value::Kind::Float)
      return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return true;
    case Value::Kind::String:
      return a.s == b.s;
    case Value::Kind::List:
      if (a.generator || b.generator) return a.list == b.list;
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::Kind::Dict:
      if (a.dict == b.dict) return true;
      if (a.dict->is_namespace || b.dict->is_namespace) return false;
      if (a.dict->entries.size() != b.dict->entries.size()) return false;
      for (const auto& [k, item] : a.dict->entries) {
        const Value* other = b.dict->find(k);
        if (!other || !equal(item, *other)) return false;
      }
      return true;
    case Value::Kind::Callable:
      return a.fn == b.fn;
    default:
      return false;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Kind::Float || b.kind == Value::Kind::Float)
      return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;  // UTF-8 byte order = code point order
  if (a.is_list() && b.is_list()) {
    const auto &x = *a.list, &y = *b.list;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (!equal(x[k], y[k])) return less(x[k], y[k]);
    }
    return x.size() < y.size();
  }
  throw TemplateError(std::string("'<' not supported between instances of '") + type_name(a) +
                      "' and '" + type_name(b) + "'");
}

Value from_json(const ojson& j, int depth) {
  if (depth > 512) throw TemplateError("JSON input nested deeper than 512 levels");
  switch (j.type()) {
    case ojson::value_t::null:
      return Value::none();
    case ojson::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case ojson::value_t::number_integer:
    case ojson::value_t::number_unsigned:
      return Value::integer(j.get<int64_t>());
    case ojson::value_t::number_float:
      return Value::number(j.get<double>());
    case ojson::value_t::string:
      return Value::string(j.get<std::string>());
    case ojson::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return Value::make_list(std::move(items));
    }
    case ojson::value_t::object: {
      Value d = Value::make_dict();
      for (const auto& [k, e] : j.items()) d.dict->entries.emplace_back(k, from_json(e, depth + 1));
      return d;
    }
    default:
      return Value::none();
  }
}

std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = std::min(tok::utf8_seq_len(static_cast<unsigned char>(s[i])), s.size() - i);
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

List iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
      return {};
    case Value::Kind::List:
      return *v.list;
    case Value::Kind::Dict: {
      List keys;
      if (v.dict->is_namespace) break;
      for (const auto& e : v.dict->entries) keys.push_back(v.dict->key_value(e.first));
      return keys;
    }
    case Value::Kind::String: {
      List chars;
      for (auto& c : utf8_chars(v.s)) chars.push_back(Value::string(std::move(c)));
      return chars;
    }
    default:
      break;
  }
  throw TemplateError(std::string("'") + type_name(v) + "' object is not iterable");
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
      return 0;
    case Value::Kind::String:
      return static_cast<int64_t>(tok::count_codepoints(v.s));
    case Value::Kind::List:
      if (!v.generator) return static_cast<int64_t>(v.list->size());
      break;
    case Value::Kind::Dict:
      if (!v.dict->is_namespace) return static_cast<int64_t>(v.dict->entries.size());
      break;
    default:
      break;
  }
  throw TemplateError(std::string("object of type '") + type_name(v) + "' has no len()");
}

}  // namespace lmx::chat
