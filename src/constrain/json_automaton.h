// The grammar of json_grammar.h run as a nondeterministic pushdown automaton over bytes: a state
// is the set of live stacks (anyOf, enum and number endings fork), each frame one open value.
// Output is compact JSON but for one optional space after each ':' and ',' (what models write),
// so every accepted text is finite under the grammar's length bounds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "constrain/json_grammar.h"

namespace lmx::constrain {

struct Frame {
  int32_t node = 0;
  int32_t phase = 0;
  int32_t count = 0;  // string code points, array items, number digits
  int32_t aux = 0;    // literal index / pending bytes / key length
  int32_t prop = -1;  // object: the property being read
  uint64_t used = 0;  // object: properties present
  uint64_t cand = 0;  // object: properties whose name matches the key read so far
  bool operator==(const Frame&) const = default;
};

using Stack = std::vector<Frame>;  // innermost value last; empty: the value is complete

struct State {
  std::vector<Stack> stacks;
  bool dead() const { return stacks.empty(); }
  // Bytes identifying the state (equal states, equal keys): the mask cache's key.
  std::string key() const;
};

class JsonAutomaton {
 public:
  explicit JsonAutomaton(Grammar g);
  State initial() const;
  // The state after `byte`; dead when no stack accepts it.
  State feed(const State& s, uint8_t byte) const;
  State feed(const State& s, std::string_view bytes) const;
  // The bytes so far form a complete value (a trailing number counts as ended).
  bool accepting(const State& s) const;
  // Whole-text check (tests): `text` is exactly one value the grammar accepts.
  bool matches(std::string_view text) const;

 private:
  void push_value(Stack st, int node, std::vector<Stack>& out, int depth = 0) const;
  void step(Stack st, uint8_t b, std::vector<Stack>& out) const;
  void child_done(Stack& st) const;
  void pop(Stack st, uint8_t b, bool consumed, std::vector<Stack>& out) const;
  void step_object(Stack st, uint8_t b, std::vector<Stack>& out) const;
  void step_array(Stack st, uint8_t b, std::vector<Stack>& out) const;
  void step_string(Stack st, uint8_t b, std::vector<Stack>& out) const;
  void step_number(Stack st, uint8_t b, std::vector<Stack>& out) const;

  Grammar g_;
  int key_string_ = -1;  // the String node free-key objects read keys with
};

}  // namespace lmx::constrain
