#include "constrain/json_grammar.h"

#include <map>
#include <set>

#include "core/error.h"

namespace lmx::constrain {

namespace {

constexpr const char* kWhere = "json-schema";

const std::set<std::string> kAnnotations = {"title",    "description", "default",  "examples",
                                            "$schema",  "$id",         "$comment", "deprecated",
                                            "readOnly", "writeOnly",   "$defs",    "definitions"};

class Compiler {
 public:
  explicit Compiler(const json& root) : root_(root) {}

  int add(GrammarNode n) {
    g.nodes.push_back(std::move(n));
    return static_cast<int>(g.nodes.size()) - 1;
  }

  int literals(std::vector<std::string> lits) {
    GrammarNode n;
    n.kind = Kind::Literals;
    n.literals = std::move(lits);
    return add(std::move(n));
  }

  // Any JSON value; built once and shared (it refers to itself through objects and arrays).
  int any() {
    if (any_ >= 0) return any_;
    any_ = add({});
    const int obj = free_object(any_), arr = array(any_, 0, -1);
    GrammarNode s;
    s.kind = Kind::String;
    GrammarNode num;
    num.kind = Kind::Number;
    const int str = add(s), number = add(num), lit = literals({"true", "false", "null"});
    g.nodes[any_].alts = {obj, arr, str, number, lit};
    return any_;
  }

  int free_object(int value) {
    GrammarNode n;
    n.kind = Kind::Object;
    n.keys = false;
    n.value = value;
    return add(std::move(n));
  }

  int array(int items, int min_items, int max_items) {
    GrammarNode n;
    n.kind = Kind::Array;
    n.value = items;
    n.min_items = min_items;
    n.max_items = max_items;
    return add(std::move(n));
  }

  int compile(const json& s, const std::string& at) {
    if (s.is_boolean()) {
      check(s.get<bool>(), kWhere, "the schema at ", at, " is false: no value can match it");
      return any();
    }
    check(s.is_object(), kWhere, "the schema at ", at, " must be an object, got ", s.dump());
    for (const auto& [key, _] : s.items()) {
      static const std::set<std::string> known = {
          "type",      "properties", "required", "additionalProperties",
          "items",     "minItems",   "maxItems", "minLength",
          "maxLength", "enum",       "const",    "anyOf",
          "$ref"};
      check(known.count(key) || kAnnotations.count(key), kWhere, "unsupported keyword '", key,
            "' at ", at);
    }
    if (s.contains("$ref")) return ref(s, at);
    if (s.contains("const")) return literals({s["const"].dump()});
    if (s.contains("enum")) {
      const json& e = s["enum"];
      check(e.is_array() && !e.empty(), kWhere, "enum at ", at, " must be a non-empty array, got ",
            e.dump());
      std::vector<std::string> lits;
      for (const auto& v : e) lits.push_back(v.dump());
      return literals(std::move(lits));
    }
    if (s.contains("anyOf")) {
      const json& a = s["anyOf"];
      check(a.is_array() && !a.empty(), kWhere, "anyOf at ", at, " must be a non-empty array, got ",
            a.dump());
      check(!s.contains("type"), kWhere, "anyOf together with type at ", at,
            " is unsupported; put the type inside each alternative");
      GrammarNode n;
      for (size_t i = 0; i < a.size(); ++i)
        n.alts.push_back(compile(a[i], at + "/anyOf/" + std::to_string(i)));
      return add(std::move(n));
    }
    if (!s.contains("type")) return any();
    const json& t = s["type"];
    if (t.is_array()) {
      check(!t.empty(), kWhere, "type at ", at, " is an empty list");
      GrammarNode n;
      for (const auto& one : t) n.alts.push_back(typed(s, one, at));
      return add(std::move(n));
    }
    return typed(s, t, at);
  }

  Grammar g;

 private:
  int ref(const json& s, const std::string& at) {
    check(s["$ref"].is_string(), kWhere, "$ref at ", at, " must be a string");
    const std::string r = s["$ref"].get<std::string>();
    if (auto it = refs_.find(r); it != refs_.end()) return it->second;
    std::string name;
    const json* defs = nullptr;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (r.rfind(p, 0) == 0) {
        name = r.substr(p.size());
        const std::string key = p.substr(2, p.size() - 3);
        if (root_.contains(key)) defs = &root_[key];
      }
    }
    if (r == "#") defs = nullptr;
    check(r == "#" || (defs && defs->contains(name)), kWhere, "$ref '", r, "' at ", at,
          " is unsupported or missing: expected '#', '#/$defs/NAME' or '#/definitions/NAME'");
    // Reserve the node first so a recursive reference finds it.
    const int id = add({});
    refs_[r] = id;
    const int target = compile(r == "#" ? root_ : (*defs)[name], r);
    g.nodes[id].alts = {target};
    return id;
  }

  int count(const json& s, const char* key, int fallback, const std::string& at) {
    if (!s.contains(key)) return fallback;
    check(s[key].is_number_integer() && s[key].get<int64_t>() >= 0, kWhere, key, " at ", at,
          " must be a non-negative integer, got ", s[key].dump());
    return static_cast<int>(s[key].get<int64_t>());
  }

  int typed(const json& s, const json& t, const std::string& at) {
    check(t.is_string(), kWhere, "type at ", at, " must be a string or a list, got ", t.dump());
    const std::string type = t.get<std::string>();
    GrammarNode n;
    if (type == "string") {
      n.kind = Kind::String;
      n.min_length = count(s, "minLength", 0, at);
      n.max_length = count(s, "maxLength", -1, at);
      check(n.max_length < 0 || n.max_length >= n.min_length, kWhere, "maxLength < minLength at ",
            at);
      return add(std::move(n));
    }
    if (type == "number" || type == "integer") {
      n.kind = type == "number" ? Kind::Number : Kind::Integer;
      return add(std::move(n));
    }
    if (type == "boolean") return literals({"true", "false"});
    if (type == "null") return literals({"null"});
    if (type == "array") {
      const int lo = count(s, "minItems", 0, at), hi = count(s, "maxItems", -1, at);
      check(hi < 0 || hi >= lo, kWhere, "maxItems < minItems at ", at);
      check(!s.contains("items") || !s["items"].is_array(), kWhere, "items at ", at,
            " is a list (tuple validation), unsupported; use prefixItems-free single schema");
      const int id = array(-1, lo, hi);
      const int items = s.contains("items") ? compile(s["items"], at + "/items") : any();
      g.nodes[id].value = items;
      return id;
    }
    if (type == "object") return object(s, at);
    fail(kWhere, "unknown type '", type, "' at ", at,
         ", expected string, number, integer, boolean, null, array or object");
  }

  int object(const json& s, const std::string& at) {
    const json* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    if (!s.contains("properties")) {
      // A map: any keys, values by additionalProperties (absent or true: anything).
      check(!s.contains("required") || s["required"].empty(), kWhere, "required at ", at,
            " without properties is unsupported");
      if (extra && extra->is_boolean() && !extra->get<bool>()) return literals({"{}"});
      const int id = free_object(-1);
      g.nodes[id].value =
          extra && extra->is_object() ? compile(*extra, at + "/additionalProperties") : any();
      return id;
    }
    check(!extra || (extra->is_boolean() && !extra->get<bool>()), kWhere,
          "additionalProperties other than false together with properties at ", at,
          " is unsupported");
    const json& props = s["properties"];
    check(props.is_object(), kWhere, "properties at ", at, " must be an object");
    check(props.size() <= 64, kWhere, "more than 64 properties at ", at, " are unsupported");
    GrammarNode n;
    n.kind = Kind::Object;
    std::vector<std::string> keys;
    for (const auto& [key, _] : props.items()) keys.push_back(key);
    const int id = add(std::move(n));
    std::vector<int> values;
    for (const std::string& key : keys)
      values.push_back(compile(props[key], at + "/properties/" + key));
    GrammarNode& o = g.nodes[id];
    o.props = values;
    for (const std::string& key : keys) {
      const std::string enc = json(key).dump();
      o.names.push_back(enc.substr(1, enc.size() - 2));
    }
    if (s.contains("required")) {
      const json& req = s["required"];
      check(req.is_array(), kWhere, "required at ", at, " must be an array of names");
      for (const auto& r : req) {
        check(r.is_string(), kWhere, "required at ", at, " must be an array of names");
        auto it = std::find(keys.begin(), keys.end(), r.get<std::string>());
        check(it != keys.end(), kWhere, "required property '", r.get<std::string>(), "' at ", at,
              " is not in properties");
        o.required |= uint64_t{1} << (it - keys.begin());
      }
    }
    return id;
  }

  const json& root_;
  int any_ = -1;
  std::map<std::string, int> refs_;
};

}  // namespace

Grammar any_json_grammar(bool object_only) {
  json dummy;
  Compiler c(dummy);
  const int any = c.any();
  c.g.root = object_only ? c.free_object(any) : any;
  return std::move(c.g);
}

Grammar compile_schema(const json& schema) {
  Compiler c(schema);
  c.g.root = c.compile(schema, "#");
  return std::move(c.g);
}

int append_grammar(Grammar& into, const Grammar& g) {
  const int base = static_cast<int>(into.nodes.size());
  const auto shift = [base](int i) { return i < 0 ? i : i + base; };
  for (GrammarNode n : g.nodes) {
    for (int& p : n.props) p = shift(p);
    for (int& a : n.alts) a = shift(a);
    n.value = shift(n.value);
    into.nodes.push_back(std::move(n));
  }
  return shift(g.root);
}

}  // namespace lmx::constrain
