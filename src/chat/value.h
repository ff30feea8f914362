// Values of the Jinja interpreter, with Python's semantics where chat templates can see them:
// truthiness, equality and ordering, str()/repr() text, and json.dumps for `tojson`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lmx::chat {

// Insertion-ordered like Python dicts: `tojson` and dict reprs must print keys in input order.
using ojson = nlohmann::ordered_json;

struct Value;
using List = std::vector<Value>;

// A Python dict in insertion order. Keys are strings (all that JSON input has); other keys that a
// template builds ({0: 'a'}) are stored under "\0" + a canonical form, the key itself in odd_keys.
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;
  bool is_namespace = false;  // jinja2's namespace(): attributes assignable with `set ns.x = ...`
  std::vector<std::pair<std::string, Value>> odd_keys;

  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
  static std::string encode_key(const Value& key);  // 1, 1.0 and True are one key, as in Python
  void set_key(const Value& key, Value v);
  Value key_value(const std::string& stored) const;  // the key as the template wrote it
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name`, or nullptr when neither is given.
  const Value* get(size_t index, std::string_view name) const;
};

struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> fn;
  bool is_macro = false;
};

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Callable };
  Kind kind = Kind::Undefined;
  bool b = false;
  bool tuple = false;  // a List that Python would hold as a tuple: repr "(a, b)"
  bool generator =
      false;  // a List jinja2 yields lazily (map, select, ...): always truthy, no len()
  bool markup =
      false;  // a String that is markupsafe.Markup (`|safe`, `|e`): `+` escapes the other side
  int64_t i = 0;
  double f = 0;
  std::string s;  // String; for Undefined the name that was looked up (for error messages)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Callable> fn;

  Value() = default;
  static Value undefined(std::string hint = "");
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value make_list(List items = {});
  static Value make_tuple(List items);
  static Value make_generator(List items);
  static Value make_markup(std::string s);
  static Value make_dict();
  static Value function(std::string name, std::function<Value(const CallArgs&)> fn);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_int() const { return kind == Kind::Int || kind == Kind::Bool; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_callable() const { return kind == Kind::Callable; }
  double as_double() const;
  int64_t as_int() const;  // Int or Bool
};

const char* type_name(const Value& v);  // Python's type name: 'str', 'dict', 'NoneType', ...
bool truthy(const Value& v);
std::string to_str(const Value& v);   // Python str(); Undefined renders as ""
std::string to_repr(const Value& v);  // Python repr()
std::string py_float_repr(double v);
bool equal(const Value& a, const Value& b);
// Python's <; throws lmx::Error for unorderable types.
bool less(const Value& a, const Value& b);

struct JsonDumpOptions {
  int indent = -1;  // < 0: one line
  bool sort_keys = false;
  bool ensure_ascii = false;
  std::string item_sep = ", ";  // Python's defaults; ",\n" style when indenting
  std::string key_sep = ": ";
};
std::string json_dumps(const Value& v, const JsonDumpOptions& opt);
std::string html_escape(const std::string& s);  // markupsafe.escape

Value from_json(const ojson& j);  // throws TemplateError past 512 levels of nesting
Value from_json(const ojson& j, int depth);

// Items a `for` loop sees: list elements, dict keys, string characters; Undefined gives none.
List iterate(const Value& v);
// len(); throws for values without one.
int64_t length(const Value& v);

// Code-point views of UTF-8 strings (Python indexes and slices strings by code point).
std::vector<std::string> utf8_chars(std::string_view s);

}  // namespace lmx::chat
