// jinja2's built-in tests (jinja2/tests.py): `x is defined`, `x is divisibleby 3`, ...
#include <map>

#include "chat/builtins.h"
#include "chat/template_error.h"

namespace lmx::chat {

namespace {

using Test = bool (*)(const Value&, const CallArgs&);

const Value& need(const CallArgs& a, const char* test) {
  if (a.positional.empty())
    throw TemplateError(std::string("test '") + test + "' takes an argument");
  return a.positional[0];
}

bool contains(const Value& container, const Value& x) {
  if (container.is_string()) {
    if (!x.is_string()) throw TemplateError("'in <string>' requires string as left operand");
    return container.s.find(x.s) != std::string::npos;
  }
  if (container.is_dict()) return container.dict->find(Dict::encode_key(x)) != nullptr;
  for (const auto& item : iterate(container))
    if (equal(item, x)) return true;
  return false;
}

bool same(const Value& a, const Value& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::List:
      return a.list == b.list;
    case Value::Kind::Dict:
      return a.dict == b.dict;
    case Value::Kind::Callable:
      return a.fn == b.fn;
    default:
      return equal(a, b);
  }
}

const std::map<std::string, Test>& tests() {
  static const std::map<std::string, Test> table = {
      {"boolean", [](const Value& v, const CallArgs&) { return v.kind == Value::Kind::Bool; }},
      {"callable",
       [](const Value& v, const CallArgs&) { return v.is_callable() || v.is_undefined(); }},
      {"defined", [](const Value& v, const CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, const CallArgs&) { return v.is_undefined(); }},
      {"divisibleby",
       [](const Value& v, const CallArgs& a) {
         const Value& n = need(a, "divisibleby");
         if (n.as_int() == 0) throw TemplateError("integer division or modulo by zero");
         return v.as_int() % n.as_int() == 0;
       }},
      {"eq", [](const Value& v, const CallArgs& a) { return equal(v, need(a, "eq")); }},
      {"ne", [](const Value& v, const CallArgs& a) { return !equal(v, need(a, "ne")); }},
      {"lt", [](const Value& v, const CallArgs& a) { return less(v, need(a, "lt")); }},
      {"le", [](const Value& v, const CallArgs& a) { return !less(need(a, "le"), v); }},
      {"gt", [](const Value& v, const CallArgs& a) { return less(need(a, "gt"), v); }},
      {"ge", [](const Value& v, const CallArgs& a) { return !less(v, need(a, "ge")); }},
      {"escaped", [](const Value&, const CallArgs&) { return false; }},
      {"even", [](const Value& v, const CallArgs&) { return v.as_int() % 2 == 0; }},
      {"odd", [](const Value& v, const CallArgs&) { return v.as_int() % 2 != 0; }},
      {"false",
       [](const Value& v, const CallArgs&) { return v.kind == Value::Kind::Bool && !v.b; }},
      {"true", [](const Value& v, const CallArgs&) { return v.kind == Value::Kind::Bool && v.b; }},
      {"filter", [](const Value& v, const CallArgs&) { return v.is_string() && has_filter(v.s); }},
      {"test", [](const Value& v, const CallArgs&) { return v.is_string() && has_test(v.s); }},
      {"float", [](const Value& v, const CallArgs&) { return v.kind == Value::Kind::Float; }},
      {"integer", [](const Value& v, const CallArgs&) { return v.kind == Value::Kind::Int; }},
      {"number", [](const Value& v, const CallArgs&) { return v.is_number(); }},
      {"in", [](const Value& v, const CallArgs& a) { return contains(need(a, "in"), v); }},
      {"iterable",
       [](const Value& v, const CallArgs&) {
         return v.is_undefined() || v.is_string() || v.is_list() ||
                (v.is_dict() && !v.dict->is_namespace);
       }},
      {"sequence",
       [](const Value& v, const CallArgs&) {
         return v.is_undefined() || v.is_string() || v.is_list() ||
                (v.is_dict() && !v.dict->is_namespace);
       }},
      {"mapping",
       [](const Value& v, const CallArgs&) { return v.is_dict() && !v.dict->is_namespace; }},
      {"none", [](const Value& v, const CallArgs&) { return v.is_none(); }},
      {"string", [](const Value& v, const CallArgs&) { return v.is_string(); }},
      {"lower",
       [](const Value& v, const CallArgs&) {
         const std::string s = to_str(v);
         return py_lower(s) == s && py_upper(s) != s;
       }},
      {"upper",
       [](const Value& v, const CallArgs&) {
         const std::string s = to_str(v);
         return py_upper(s) == s && py_lower(s) != s;
       }},
      {"sameas", [](const Value& v, const CallArgs& a) { return same(v, need(a, "sameas")); }},
  };
  return table;
}

const std::map<std::string, std::string>& test_aliases() {
  static const std::map<std::string, std::string> a = {
      {"==", "eq"}, {"equalto", "eq"}, {"!=", "ne"},          {"<", "lt"}, {"lessthan", "lt"},
      {"<=", "le"}, {">", "gt"},       {"greaterthan", "gt"}, {">=", "ge"}};
  return a;
}

}  // namespace

bool has_test(const std::string& name) { return tests().count(name) || test_aliases().count(name); }

bool apply_test(const std::string& name, const Value& v, const CallArgs& args) {
  auto alias = test_aliases().find(name);
  auto it = tests().find(alias == test_aliases().end() ? name : alias->second);
  if (it == tests().end()) throw TemplateError("No test named '" + name + "'.");
  return it->second(v, args);
}

bool value_in(const Value& x, const Value& container) { return contains(container, x); }

}  // namespace lmx::chat
