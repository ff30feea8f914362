#include "constrain/json_automaton.h"

#include <algorithm>

#include "core/error.h"

namespace lmx::constrain {

namespace {

bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

// String phases.
enum : int32_t { kOpen, kChars, kEscape, kHex, kCont };
// Number phases; the accepting ones are where the text so far is a whole number.
enum : int32_t { kStart, kMinus, kInt, kZero, kDot, kFrac, kE, kESign, kExp };

bool number_accepting(Kind k, int32_t phase) {
  if (phase == kInt || phase == kZero) return true;
  return k == Kind::Number && (phase == kFrac || phase == kExp);
}

// Range of the next UTF-8 continuation byte, packed as lo | hi << 8 (RFC 3629's table).
int32_t first_cont_range(uint8_t lead) {
  if (lead == 0xE0) return 0xA0 | 0xBF << 8;
  if (lead == 0xED) return 0x80 | 0x9F << 8;
  if (lead == 0xF0) return 0x90 | 0xBF << 8;
  if (lead == 0xF4) return 0x80 | 0x8F << 8;
  return 0x80 | 0xBF << 8;
}

// The node of a frame that takes one optional space before what follows ':' or ','.
constexpr int32_t kSpace = -1;

void push_space(std::vector<Stack>& stacks, size_t from) {
  for (size_t i = from; i < stacks.size(); ++i) stacks[i].push_back(Frame{.node = kSpace});
}

void append_i32(std::string& out, int64_t v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace

std::string State::key() const {
  std::string k;
  for (const Stack& st : stacks) {
    for (const Frame& f : st) {
      for (int64_t v :
           {int64_t{f.node}, int64_t{f.phase}, int64_t{f.count}, int64_t{f.aux}, int64_t{f.prop},
            static_cast<int64_t>(f.used), static_cast<int64_t>(f.cand)})
        append_i32(k, v);
    }
    k.push_back('|');
  }
  return k;
}

JsonAutomaton::JsonAutomaton(Grammar g) : g_(std::move(g)) {
  GrammarNode s;
  s.kind = Kind::String;
  g_.nodes.push_back(s);
  key_string_ = static_cast<int>(g_.nodes.size()) - 1;
}

State JsonAutomaton::initial() const {
  State s;
  push_value({}, g_.root, s.stacks);
  return s;
}

void JsonAutomaton::push_value(Stack st, int node, std::vector<Stack>& out, int depth) const {
  check(depth < 64, "json-schema", "a $ref or anyOf cycle that consumes no input");
  const GrammarNode& n = g_.nodes[node];
  if (n.kind == Kind::AnyOf) {
    for (int alt : n.alts) push_value(st, alt, out, depth + 1);
    return;
  }
  if (n.kind == Kind::Sequence) {
    Frame f;
    f.node = node;
    st.push_back(f);
    push_value(std::move(st), n.alts[0], out, depth + 1);
    return;
  }
  const int forks = n.kind == Kind::Literals ? static_cast<int>(n.literals.size()) : 1;
  for (int i = 0; i < forks; ++i) {
    Stack s = st;
    Frame f;
    f.node = node;
    f.aux = n.kind == Kind::Literals ? i : 0;
    s.push_back(f);
    out.push_back(std::move(s));
  }
}

void JsonAutomaton::child_done(Stack& st) const {
  Frame& f = st.back();
  const GrammarNode& n = g_.nodes[f.node];
  if (n.kind == Kind::Array) {
    // Counts past what the bounds need are folded, so equal futures share a state key.
    f.count = n.max_items < 0 ? std::min(f.count + 1, n.min_items) : f.count + 1;
    f.phase = 3;
  } else if (f.phase == 2) {  // a free-key object's key
    f.phase = 4;
  } else {
    if (n.keys) f.used |= uint64_t{1} << f.prop;
    f.phase = 6;
  }
}

void JsonAutomaton::pop(Stack st, uint8_t b, bool consumed, std::vector<Stack>& out) const {
  st.pop_back();
  if (!st.empty() && g_.nodes[st.back().node].kind == Kind::Sequence) {
    Frame& f = st.back();
    const GrammarNode& n = g_.nodes[f.node];
    if (++f.phase == static_cast<int32_t>(n.alts.size()))
      return pop(std::move(st), b, consumed, out);
    std::vector<Stack> next;
    push_value(std::move(st), n.alts[f.phase], next);
    for (Stack& s : next) {
      if (consumed)
        out.push_back(std::move(s));
      else
        step(std::move(s), b, out);
    }
    return;
  }
  if (!st.empty()) child_done(st);
  if (consumed) {
    out.push_back(std::move(st));
  } else if (!st.empty()) {
    step(std::move(st), b, out);  // the byte that ended a number belongs to its container
  }
}

void JsonAutomaton::step(Stack st, uint8_t b, std::vector<Stack>& out) const {
  if (st.empty()) return;  // nothing may follow a complete value
  if (st.back().node == kSpace) {
    st.pop_back();
    if (b == ' ')
      out.push_back(std::move(st));
    else
      step(std::move(st), b, out);
    return;
  }
  Frame& f = st.back();
  const GrammarNode& n = g_.nodes[f.node];
  switch (n.kind) {
    case Kind::Object:
      return step_object(std::move(st), b, out);
    case Kind::Array:
      return step_array(std::move(st), b, out);
    case Kind::String:
      return step_string(std::move(st), b, out);
    case Kind::Number:
    case Kind::Integer:
      return step_number(std::move(st), b, out);
    case Kind::Literals: {
      const std::string& lit = n.literals[f.aux];
      if (static_cast<uint8_t>(lit[f.count]) != b) return;
      if (++f.count == static_cast<int32_t>(lit.size())) return pop(std::move(st), b, true, out);
      out.push_back(std::move(st));
      return;
    }
    case Kind::AnyOf:
    case Kind::Sequence:
      return;  // expanded by push_value; a sequence is always under its current part
  }
}

void JsonAutomaton::step_object(Stack st, uint8_t b, std::vector<Stack>& out) const {
  Frame& f = st.back();
  const GrammarNode& n = g_.nodes[f.node];
  const uint64_t all = n.names.size() == 64 ? ~uint64_t{0} : (uint64_t{1} << n.names.size()) - 1;
  const auto start_key = [&] {
    if (!n.keys) {
      f.phase = 2;
      Frame k;
      k.node = key_string_;
      k.phase = kChars;
      st.push_back(k);
    } else {
      f.cand = all & ~f.used;
      if (!f.cand) return;
      f.aux = 0;
      f.phase = 2;
    }
    out.push_back(std::move(st));
  };
  switch (f.phase) {
    case 0:
      if (b == '{') f.phase = 1, out.push_back(std::move(st));
      return;
    case 1:
      if (b == '}' && (n.required & ~f.used) == 0) return pop(std::move(st), b, true, out);
      if (b == '"') start_key();
      return;
    case 3:
      if (b == '"') start_key();
      return;
    case 2: {  // inside a listed property's name
      uint64_t next = 0;
      for (size_t p = 0; p < n.names.size(); ++p) {
        if (!(f.cand >> p & 1)) continue;
        const std::string& name = n.names[p];
        if (b == '"' && static_cast<int32_t>(name.size()) == f.aux) {
          f.prop = static_cast<int32_t>(p);
          f.phase = 4;
          f.cand = 0;
          out.push_back(std::move(st));
          return;
        }
        if (f.aux < static_cast<int32_t>(name.size()) && static_cast<uint8_t>(name[f.aux]) == b)
          next |= uint64_t{1} << p;
      }
      if (!next) return;
      f.cand = next;
      ++f.aux;
      out.push_back(std::move(st));
      return;
    }
    case 4: {
      if (b != ':') return;
      f.phase = 5;
      const size_t from = out.size();
      push_value(std::move(st), n.keys ? n.props[f.prop] : n.value, out);
      push_space(out, from);
      return;
    }
    case 6:
      if (b == ',' && (!n.keys || (all & ~f.used))) {
        f.phase = 3;
        out.push_back(std::move(st));
        push_space(out, out.size() - 1);
      }
      if (b == '}' && (n.required & ~f.used) == 0) pop(std::move(st), b, true, out);
      return;
    default:
      return;
  }
}

void JsonAutomaton::step_array(Stack st, uint8_t b, std::vector<Stack>& out) const {
  Frame& f = st.back();
  const GrammarNode& n = g_.nodes[f.node];
  switch (f.phase) {
    case 0:
      if (b == '[') f.phase = 1, out.push_back(std::move(st));
      return;
    case 1: {
      if (b == ']') {
        if (n.min_items == 0) pop(std::move(st), b, true, out);
        return;
      }
      if (n.max_items == 0) return;
      f.phase = 2;
      std::vector<Stack> items;
      push_value(std::move(st), n.value, items);
      for (Stack& s : items) step(std::move(s), b, out);
      return;
    }
    case 3:
      if (b == ',' && (n.max_items < 0 || f.count < n.max_items)) {
        f.phase = 2;
        const size_t from = out.size();
        push_value(std::move(st), n.value, out);
        push_space(out, from);
      } else if (b == ']' && f.count >= n.min_items) {
        pop(std::move(st), b, true, out);
      }
      return;
    default:
      return;
  }
}

void JsonAutomaton::step_string(Stack st, uint8_t b, std::vector<Stack>& out) const {
  Frame& f = st.back();
  const GrammarNode& n = g_.nodes[f.node];
  const bool room = n.max_length < 0 || f.count < n.max_length;
  const auto one_more = [&] {
    f.count = n.max_length < 0 ? std::min(f.count + 1, n.min_length) : f.count + 1;
  };
  switch (f.phase) {
    case kOpen:
      if (b != '"') return;
      f.phase = kChars;
      break;
    case kChars:
      if (b == '"') {
        if (f.count >= n.min_length) pop(std::move(st), b, true, out);
        return;
      }
      if (b < 0x20 || !room) return;
      if (b == '\\') {
        f.phase = kEscape;
      } else if (b >= 0x80) {
        if (b < 0xC2 || b > 0xF4) return;
        f.phase = kCont;
        f.aux = b < 0xE0 ? 1 : b < 0xF0 ? 2 : 3;
        f.prop = first_cont_range(b);
      }
      one_more();
      break;
    case kEscape:
      if (b == 'u') {
        f.phase = kHex;
        f.aux = 4;
      } else if (std::string_view("\"\\/bfnrt").find(static_cast<char>(b)) !=
                 std::string_view::npos) {
        f.phase = kChars;
      } else {
        return;
      }
      break;
    case kHex:
      if (!is_hex(b)) return;
      if (--f.aux == 0) f.phase = kChars;
      break;
    case kCont:
      if (b < (f.prop & 0xFF) || b > (f.prop >> 8)) return;
      f.prop = 0x80 | 0xBF << 8;
      if (--f.aux == 0) f.phase = kChars, f.prop = -1;
      break;
    default:
      return;
  }
  out.push_back(std::move(st));
}

void JsonAutomaton::step_number(Stack st, uint8_t b, std::vector<Stack>& out) const {
  Frame& f = st.back();
  const Kind k = g_.nodes[f.node].kind;
  const bool digit = is_digit(b);
  int32_t next = -1;
  switch (f.phase) {
    case kStart:
      next = b == '-' ? kMinus : b == '0' ? kZero : digit ? kInt : -1;
      break;
    case kMinus:
      next = b == '0' ? kZero : digit ? kInt : -1;
      break;
    case kInt:
      if (digit && f.count < kMaxIntDigits) next = kInt;
      break;
    case kDot:
      if (digit) next = kFrac;
      break;
    case kFrac:
      if (digit && f.count < kMaxFracDigits) next = kFrac;
      break;
    case kE:
      next = (b == '+' || b == '-') ? kESign : digit ? kExp : -1;
      break;
    case kESign:
      if (digit) next = kExp;
      break;
    case kExp:
      if (digit && f.count < kMaxExpDigits) next = kExp;
      break;
    default:
      break;
  }
  if (k == Kind::Number && (f.phase == kInt || f.phase == kZero) && b == '.') next = kDot;
  if (k == Kind::Number && (f.phase == kInt || f.phase == kZero || f.phase == kFrac) &&
      (b == 'e' || b == 'E'))
    next = kE;
  if (next < 0) {
    // Not part of the number: it ends here if it is whole, and the byte goes to the container.
    if (number_accepting(k, f.phase)) pop(std::move(st), b, false, out);
    return;
  }
  f.count = next == f.phase ? f.count + 1 : digit ? 1 : 0;
  f.phase = next;
  out.push_back(std::move(st));
}

State JsonAutomaton::feed(const State& s, uint8_t byte) const {
  State next;
  for (const Stack& st : s.stacks) step(st, byte, next.stacks);
  if (next.stacks.size() < 2) return next;
  // Forks that converge (anyOf alternatives with the same future) are kept once.
  std::vector<Stack> unique;
  for (Stack& st : next.stacks)
    if (std::find(unique.begin(), unique.end(), st) == unique.end())
      unique.push_back(std::move(st));
  next.stacks = std::move(unique);
  return next;
}

State JsonAutomaton::feed(const State& s, std::string_view bytes) const {
  State cur = s;
  for (char c : bytes) {
    cur = feed(cur, static_cast<uint8_t>(c));
    if (cur.dead()) break;
  }
  return cur;
}

bool JsonAutomaton::accepting(const State& s) const {
  for (const Stack& st : s.stacks) {
    if (st.empty()) return true;
    const Frame& f = st.back();
    if (st.size() != 1) continue;  // inside a container (or before its optional space)
    const Kind k = g_.nodes[f.node].kind;
    if ((k == Kind::Number || k == Kind::Integer) && number_accepting(k, f.phase)) return true;
  }
  return false;
}

bool JsonAutomaton::matches(std::string_view text) const {
  State s = feed(initial(), text);
  return !s.dead() && accepting(s);
}

}  // namespace lmx::constrain
