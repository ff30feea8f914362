// A grammar for JSON values derived from a JSON schema: a graph of nodes (cycles allowed, for
// recursive $ref) that json_automaton.h runs as a pushdown automaton over bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"

namespace lmx::constrain {

enum class Kind : uint8_t { Object, Array, String, Number, Integer, Literals, AnyOf, Sequence };

struct GrammarNode {
  Kind kind = Kind::AnyOf;
  // Object with listed properties (`keys` false: any string key, each value `value`).
  bool keys = true;
  std::vector<std::string> names;  // JSON-encoded property names, without the quotes
  std::vector<int> props;          // node of each property's value
  uint64_t required = 0;           // bit i: names[i] is required
  int value = -1;                  // free-key objects: node of every value
  // Array: `value` is the items' node.
  int min_items = 0, max_items = -1;  // -1: unbounded
  // String.
  int min_length = 0, max_length = -1;  // code points (an escape counts as one)
  // Literals: the exact JSON texts allowed (enum, const, true/false, null).
  std::vector<std::string> literals;
  // AnyOf: the alternatives. Sequence: the parts, matched one after another (raw text around a
  // JSON value, e.g. a tool call's wrapper); its last part must not be a bare number.
  std::vector<int> alts;
};

// Digits a generated number may have: the output must stay finite under any sampling.
constexpr int kMaxIntDigits = 16, kMaxFracDigits = 16, kMaxExpDigits = 3;

struct Grammar {
  std::vector<GrammarNode> nodes;
  int root = 0;
};

// Any JSON value (`object_only`: any JSON object), as response_format json_object wants.
Grammar any_json_grammar(bool object_only);

// Throws lmx::Error("[json-schema] ...") naming the unsupported keyword or bad value and its
// location (a JSON pointer such as #/properties/name). Supported: type (one or a list), properties,
// required, additionalProperties (false, the default when properties are given, or a schema
// without properties), items, minItems, maxItems, minLength, maxLength, enum, const, anyOf,
// $ref into #/$defs or #/definitions; annotations (title, description, default, examples, ...)
// are ignored.
Grammar compile_schema(const json& schema);

// Copies g's nodes to the end of `into` (their indices shifted); returns g's root there.
int append_grammar(Grammar& into, const Grammar& g);

}  // namespace lmx::constrain
