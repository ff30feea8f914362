#include "chat/interpreter.h"

#include <cmath>
#include <unordered_map>

#include "chat/builtins.h"
#include "chat/template_error.h"

namespace lmx::chat {

namespace {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

ScopePtr child(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

enum class Flow { Normal, Break, Continue };

[[noreturn]] void undefined_error(const Value& v) {
  throw TemplateError(v.s.empty() ? "undefined value" : v.s);
}

Value floor_div(const Value& a, const Value& b) {
  if (a.is_int() && b.is_int()) {
    if (b.as_int() == 0) throw TemplateError("integer division or modulo by zero");
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t q = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
    return Value::integer(q);
  }
  if (b.as_double() == 0) throw TemplateError("float floor division by zero");
  return Value::number(std::floor(a.as_double() / b.as_double()));
}

Value modulo(const Value& a, const Value& b) {
  if (a.is_int() && b.is_int()) {
    if (b.as_int() == 0) throw TemplateError("integer division or modulo by zero");
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value::integer(r);
  }
  if (b.as_double() == 0) throw TemplateError("float modulo");
  const double x = a.as_double(), y = b.as_double();
  double r = std::fmod(x, y);
  if (r != 0 && ((r < 0) != (y < 0))) r += y;
  return Value::number(r);
}

[[noreturn]] void bad_operands(const std::string& op, const Value& a, const Value& b) {
  throw TemplateError("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
                      type_name(b) + "'");
}

constexpr size_t kMaxOutput = size_t{1}
                              << 28;  // 256 MiB: a runaway template errors, never exhausts memory

Value repeat(const Value& seq, int64_t n) {
  const size_t unit = seq.is_string() ? seq.s.size() : seq.list->size() * 16;
  if (n > 0 && unit > 0 && static_cast<size_t>(n) > kMaxOutput / unit)
    throw TemplateError("repetition result too large");
  if (seq.is_string()) {
    std::string out;
    for (int64_t k = 0; k < n; ++k) out += seq.s;
    return Value::string(out);
  }
  List out;
  for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return Value::make_list(std::move(out));
}

// Python ints are unbounded; lmx's are int64 and say so instead of wrapping.
Value int_op(char op, int64_t x, int64_t y) {
  int64_t r = 0;
  const bool overflow = op == '+'   ? __builtin_add_overflow(x, y, &r)
                        : op == '-' ? __builtin_sub_overflow(x, y, &r)
                                    : __builtin_mul_overflow(x, y, &r);
  if (overflow) throw TemplateError("integer overflow (lmx's template integers are 64-bit)");
  return Value::integer(r);
}

Value arith(const std::string& op, const Value& a, const Value& b, bool rhs_is_tuple) {
  if (op == "~") return Value::string(to_str(a) + to_str(b));
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  const bool nums = a.is_number() && b.is_number();
  const bool floats = nums && (a.kind == Value::Kind::Float || b.kind == Value::Kind::Float);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (!a.markup && !b.markup) return Value::string(a.s + b.s);
      return Value::make_markup((a.markup ? a.s : html_escape(a.s)) +
                                (b.markup ? b.s : html_escape(b.s)));
    }
    if (a.is_list() && b.is_list()) {
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(out));
    }
    if (nums)
      return floats ? Value::number(a.as_double() + b.as_double())
                    : int_op('+', a.as_int(), b.as_int());
  } else if (op == "-") {
    if (nums)
      return floats ? Value::number(a.as_double() - b.as_double())
                    : int_op('-', a.as_int(), b.as_int());
  } else if (op == "*") {
    if (nums)
      return floats ? Value::number(a.as_double() * b.as_double())
                    : int_op('*', a.as_int(), b.as_int());
    if ((a.is_string() || a.is_list()) && b.is_int()) return repeat(a, b.as_int());
    if (a.is_int() && (b.is_string() || b.is_list())) return repeat(b, a.as_int());
  } else if (op == "/") {
    if (nums) {
      if (b.as_double() == 0) throw TemplateError("division by zero");
      return Value::number(a.as_double() / b.as_double());
    }
  } else if (op == "//") {
    if (nums) return floor_div(a, b);
  } else if (op == "%") {
    if (a.is_string())
      return Value::string(
          percent_format(a.s, rhs_is_tuple || !b.is_list() ? b : Value::make_list({b})));
    if (nums) return modulo(a, b);
  } else if (op == "**") {
    if (nums) {
      if (!floats && b.as_int() >= 0) {
        // By squaring: `0 ** 10**14` never overflows, so one multiply per unit of the exponent
        // hung. A square that overflows while exponent bits remain means the result does too.
        int64_t base = a.as_int(), r = 1;
        for (int64_t e = b.as_int(); e > 0; e >>= 1) {
          if (e & 1) r = int_op('*', r, base).i;
          if (e > 1) base = int_op('*', base, base).i;
        }
        return Value::integer(r);
      }
      return Value::number(std::pow(a.as_double(), b.as_double()));
    }
  }
  bad_operands(op, a, b);
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "in") return value_in(a, b);
  if (op == "notin") return !value_in(a, b);
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (op == "<") return less(a, b);
  if (op == ">") return less(b, a);
  if (op == "<=") return !less(b, a);
  return !less(a, b);  // >=
}

class Renderer {
 public:
  Flow exec(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& s : body) {
      try {
        const Flow f = exec_one(*s, scope, out);
        if (f != Flow::Normal) return f;
      } catch (TemplateError& e) {
        if (!e.line) e.line = s->line;
        throw;
      }
    }
    return Flow::Normal;
  }

 private:
  Flow exec_one(const Stmt& s, const ScopePtr& scope, std::string& out) {
    if (out.size() > kMaxOutput) throw TemplateError("rendered output exceeds 256 MiB");
    switch (s.kind) {
      case Stmt::Kind::Text:
        out += s.text;
        break;
      case Stmt::Kind::Output:
        out += to_str(eval(*s.expr, scope));
        break;
      case Stmt::Kind::If:
        for (size_t k = 0; k < s.conds.size(); ++k)
          if (truthy(eval(*s.conds[k], scope))) return exec(s.bodies[k], scope, out);
        return exec(s.else_body, scope, out);
      case Stmt::Kind::For:
        return exec_for(s, scope, out);
      case Stmt::Kind::Set:
        if (s.target) {
          const Value ns = eval(*s.target->items[0], scope);
          if (!ns.is_dict() || !ns.dict->is_namespace)
            throw TemplateError("cannot assign attribute on non-namespace object");
          if (!s.target->name.empty() && s.target->name[0] == '_')
            throw TemplateError(
                "Chat templates cannot store underscore-prefixed attributes on a namespace");
          ns.dict->set(s.target->name, eval(*s.expr, scope));
        } else {
          assign(s.targets, eval(*s.expr, scope), *scope, s.expr->kind == Expr::Kind::Tuple);
        }
        break;
      case Stmt::Kind::SetBlock: {
        std::string captured;
        exec(s.body, scope, captured);
        Value v = Value::string(captured);
        if (s.expr) v = eval_filter(*s.expr, scope, &v);
        scope->vars[s.targets[0]] = v;
        break;
      }
      case Stmt::Kind::Macro:
        scope->vars[s.text] = make_macro(s, scope, s.text);
        break;
      case Stmt::Kind::CallBlock: {
        const Value caller = make_macro(s, scope, "caller");
        out += to_str(call(*s.expr, scope, &caller));
        break;
      }
      case Stmt::Kind::FilterBlock: {
        std::string captured;
        exec(s.body, scope, captured);
        const Value v = Value::string(captured);
        out += to_str(eval_filter(*s.expr, scope, &v));
        break;
      }
      case Stmt::Kind::Break:
        return Flow::Break;
      case Stmt::Kind::Continue:
        return Flow::Continue;
      case Stmt::Kind::Scope: {
        if (s.text != "with") return exec(s.body, scope, out);
        ScopePtr inner = child(scope);
        for (const auto& [name, e] : s.with_vars) inner->vars[name] = eval(*e, scope);
        return exec(s.body, inner, out);
      }
    }
    return Flow::Normal;
  }

  static void assign(const std::vector<std::string>& targets, const Value& v, Scope& scope, bool) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = v;
      return;
    }
    const List items = iterate(v);
    if (items.size() != targets.size())
      throw TemplateError("cannot unpack " + std::to_string(items.size()) + " values into " +
                          std::to_string(targets.size()) + " names");
    for (size_t k = 0; k < targets.size(); ++k) scope.vars[targets[k]] = items[k];
  }

  Flow exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
    const Value seq = eval(*s.expr, scope);
    List items;
    for (const auto& item : iterate(seq)) {
      if (s.cond) {
        ScopePtr probe = child(scope);
        assign(s.targets, item, *probe, false);
        if (!truthy(eval(*s.cond, probe))) continue;
      }
      items.push_back(item);
    }
    if (items.empty()) return exec(s.else_body, scope, out);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      ScopePtr iter = child(scope);
      assign(s.targets, items[k], *iter, false);
      Value loop = Value::make_dict();
      Dict& d = *loop.dict;
      d.set("index", Value::integer(k + 1));
      d.set("index0", Value::integer(k));
      d.set("revindex", Value::integer(n - k));
      d.set("revindex0", Value::integer(n - k - 1));
      d.set("first", Value::boolean(k == 0));
      d.set("last", Value::boolean(k == n - 1));
      d.set("length", Value::integer(n));
      d.set("depth", Value::integer(1));
      d.set("depth0", Value::integer(0));
      d.set("previtem", k > 0 ? items[k - 1] : Value::undefined("there is no previous item"));
      d.set("nextitem", k + 1 < n ? items[k + 1] : Value::undefined("there is no next item"));
      d.set("cycle", Value::function("cycle", [k](const CallArgs& a) {
              if (a.positional.empty()) throw TemplateError("no items for cycling given");
              return a.positional[static_cast<size_t>(k) % a.positional.size()];
            }));
      iter->vars["loop"] = loop;
      if (exec(s.body, iter, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  // The macro refers to its defining scope without owning it: the scope holds the macro, so
  // owning it would be a reference cycle. The renderer keeps such scopes alive until render()
  // returns, and macros cannot outlive a render (its result is a string).
  Value make_macro(const Stmt& s, const ScopePtr& defining, const std::string& name) {
    const Stmt* st = &s;
    if (pinned_.empty() || pinned_.back() != defining) pinned_.push_back(defining);
    std::weak_ptr<Scope> parent = defining;
    Value m = Value::function(name, [this, st, parent](const CallArgs& a) {
      if (++depth_ > 256) throw TemplateError("maximum macro recursion depth exceeded");
      ScopePtr scope = std::make_shared<Scope>();
      scope->parent = parent.lock();
      List varargs;
      Value kwargs = Value::make_dict();
      for (size_t k = 0; k < a.positional.size(); ++k) {
        if (k < st->params.size())
          scope->vars[st->params[k].name] = a.positional[k];
        else
          varargs.push_back(a.positional[k]);
      }
      for (const auto& [key, v] : a.keyword) {
        const bool is_param =
            std::any_of(st->params.begin(), st->params.end(),
                        [&name = key](const MacroParam& p) { return p.name == name; });
        if (is_param || key == "caller")
          scope->vars[key] = v;
        else
          kwargs.dict->set(key, v);
      }
      for (const auto& p : st->params)
        if (!scope->vars.count(p.name))
          scope->vars[p.name] = p.default_value ? eval(*p.default_value, scope)
                                                : Value::undefined("'" + p.name + "' is undefined");
      scope->vars["varargs"] = Value::make_tuple(std::move(varargs));
      scope->vars["kwargs"] = kwargs;
      std::string out;
      exec(st->body, scope, out);
      --depth_;
      return Value::string(out);
    });
    m.fn->is_macro = true;
    return m;
  }

  CallArgs eval_args(const std::vector<Arg>& args, const ScopePtr& scope) {
    CallArgs out;
    for (const auto& a : args) {
      if (a.name == "*") {
        for (auto& v : iterate(eval(*a.value, scope))) out.positional.push_back(std::move(v));
      } else if (a.name == "**") {
        const Value d = eval(*a.value, scope);
        if (!d.is_dict()) throw TemplateError("argument after ** must be a mapping");
        for (const auto& [k, v] : d.dict->entries) out.keyword.emplace_back(k, v);
      } else if (a.name.empty())
        out.positional.push_back(eval(*a.value, scope));
      else
        out.keyword.emplace_back(a.name, eval(*a.value, scope));
    }
    return out;
  }

  Value call(const Expr& e, const ScopePtr& scope, const Value* caller) {
    const Value fn = eval(*e.items[0], scope);
    CallArgs args = eval_args(e.args, scope);
    if (caller) args.keyword.emplace_back("caller", *caller);
    if (fn.is_undefined()) undefined_error(fn);
    if (!fn.is_callable())
      throw TemplateError(std::string("'") + type_name(fn) + "' object is not callable");
    return fn.fn->fn(args);
  }

  Value eval_filter(const Expr& e, const ScopePtr& scope, const Value* input) {
    Value base;
    if (e.items.empty())
      base = *input;
    else if (e.items[0]->kind == Expr::Kind::Filter && input)
      base = eval_filter(*e.items[0], scope, input);
    else
      base = eval(*e.items[0], scope);
    return apply_filter(e.name, base, eval_args(e.args, scope));
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case Expr::Kind::Literal:
        return e.value;
      case Expr::Kind::Name: {
        if (const Value* v = scope->find(e.name)) return *v;
        return global(e.name);
      }
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        List items;
        for (const auto& x : e.items) items.push_back(eval(*x, scope));
        if (e.kind == Expr::Kind::Tuple) return Value::make_tuple(std::move(items));
        return Value::make_list(std::move(items));
      }
      case Expr::Kind::Dict: {
        Value d = Value::make_dict();
        for (size_t k = 0; k + 1 < e.items.size(); k += 2)
          d.dict->set_key(eval(*e.items[k], scope), eval(*e.items[k + 1], scope));
        return d;
      }
      case Expr::Kind::Attr:
        return get_attr(eval(*e.items[0], scope), e.name);
      case Expr::Kind::Item:
        return get_item(eval(*e.items[0], scope), eval(*e.items[1], scope));
      case Expr::Kind::Slice: {
        const Value base = eval(*e.items[0], scope);
        Value parts[3];
        const Value* ptrs[3] = {nullptr, nullptr, nullptr};
        for (int k = 0; k < 3; ++k)
          if (e.items[k + 1]) parts[k] = eval(*e.items[k + 1], scope), ptrs[k] = &parts[k];
        return slice(base, ptrs[0], ptrs[1], ptrs[2]);
      }
      case Expr::Kind::Call:
        return call(e, scope, nullptr);
      case Expr::Kind::Filter:
        return eval_filter(e, scope, nullptr);
      case Expr::Kind::Test: {
        const bool r = apply_test(e.name, eval(*e.items[0], scope), eval_args(e.args, scope));
        return Value::boolean(r != e.negated);
      }
      case Expr::Kind::Unary: {
        const Value v = eval(*e.items[0], scope);
        if (e.name == "not") return Value::boolean(!truthy(v));
        if (v.is_undefined()) undefined_error(v);
        if (!v.is_number())
          throw TemplateError(std::string("bad operand type for unary ") + e.name + ": '" +
                              type_name(v) + "'");
        if (e.name == "+") return v.kind == Value::Kind::Float ? v : Value::integer(v.as_int());
        return v.kind == Value::Kind::Float ? Value::number(-v.f) : int_op('-', 0, v.as_int());
      }
      case Expr::Kind::Binary: {
        const Value a = eval(*e.items[0], scope);
        if (e.name == "and") return truthy(a) ? eval(*e.items[1], scope) : a;
        if (e.name == "or") return truthy(a) ? a : eval(*e.items[1], scope);
        return arith(e.name, a, eval(*e.items[1], scope), e.items[1]->kind == Expr::Kind::Tuple);
      }
      case Expr::Kind::Compare: {
        Value left = eval(*e.items[0], scope);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.items[k + 1], scope);
          if (!compare(e.ops[k], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::Cond:
        if (truthy(eval(*e.items[0], scope))) return eval(*e.items[1], scope);
        return e.items[2] ? eval(*e.items[2], scope)
                          : Value::undefined(
                                "the inline if-expression evaluated to false and no else section "
                                "was defined");
    }
    return Value::undefined();
  }

  int depth_ = 0;
  std::vector<ScopePtr> pinned_;  // scopes that macros were defined in
};

}  // namespace

std::string render(const Body& program, const Dict& vars) {
  auto root = std::make_shared<Scope>();
  for (const auto& [k, v] : vars.entries) root->vars[k] = v;
  Renderer r;
  std::string out;
  r.exec(program, root, out);
  return out;
}

}  // namespace lmx::chat
