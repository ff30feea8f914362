// Expressions, from the conditional expression down to literals, postfix operators, filters
// and tests.
#include <set>

#include "chat/parser_impl.h"

namespace lmx::chat {

using T = Token::Type;

int64_t Parser::int_literal(const std::string& digits) const {
  try {
    return std::stoll(digits);
  } catch (const std::exception&) {
    error("integer literal " + digits + " does not fit in 64 bits");
  }
}

ExprPtr Parser::parse_tuple(bool with_condexpr, bool explicit_parens) {
  const int line = cur().line;
  std::vector<ExprPtr> items;
  bool comma = false;
  while (true) {
    if (!items.empty() && !skip_op(",")) break;
    if (!items.empty()) comma = true;
    if (is_op(")") || cur().type == T::VarEnd || cur().type == T::BlockEnd ||
        (cur().type == T::Name && (cur().value == "if" || cur().value == "in") && !items.empty()))
      break;
    items.push_back(with_condexpr ? parse_expression() : parse_or());
  }
  if (items.size() == 1 && !comma) return std::move(items[0]);
  if (items.empty() && !explicit_parens) {
    // jinja2's describe_token for what was found instead.
    const std::string found = cur().type == T::BlockEnd ? "end of statement block"
                              : cur().type == T::VarEnd ? "end of print statement"
                              : cur().type == T::Eof    ? "end of template"
                                                        : cur().value;
    error("expected an expression, got '" + found + "'");
  }
  auto e = node(Expr::Kind::Tuple, line);
  e->items = std::move(items);
  return e;
}

ExprPtr Parser::parse_expression() {
  const Nesting guard(*this);
  ExprPtr e = parse_or();
  while (is_name("if")) {
    const int line = next().line;
    auto c = node(Expr::Kind::Cond, line);
    c->items.push_back(parse_or());
    c->items.push_back(std::move(e));
    c->items.push_back(skip_name("else") ? parse_expression() : nullptr);
    e = std::move(c);
  }
  return e;
}

ExprPtr Parser::binary(const std::string& op, ExprPtr a, ExprPtr b) {
  auto e = node(Expr::Kind::Binary, a->line);
  e->name = op;
  e->items.push_back(std::move(a));
  e->items.push_back(std::move(b));
  return e;
}

ExprPtr Parser::parse_or() {
  ExprPtr e = parse_and();
  while (skip_name("or")) e = binary("or", std::move(e), parse_and());
  return e;
}

ExprPtr Parser::parse_and() {
  ExprPtr e = parse_not();
  while (skip_name("and")) e = binary("and", std::move(e), parse_not());
  return e;
}

ExprPtr Parser::parse_not() {
  const Nesting guard(*this);
  if (is_name("not")) {
    auto e = node(Expr::Kind::Unary, next().line);
    e->name = "not";
    e->items.push_back(parse_not());
    return e;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  ExprPtr first = parse_math1();
  auto e = node(Expr::Kind::Compare, first->line);
  e->items.push_back(std::move(first));
  while (true) {
    static const std::set<std::string> kOps = {"==", "!=", "<", ">", "<=", ">="};
    if (cur().type == T::Op && kOps.count(cur().value)) {
      e->ops.push_back(next().value);
    } else if (skip_name("in")) {
      e->ops.push_back("in");
    } else if (is_name("not") && peek().type == T::Name && peek().value == "in") {
      i_ += 2;
      e->ops.push_back("notin");
    } else {
      break;
    }
    e->items.push_back(parse_math1());
  }
  if (e->ops.empty()) return std::move(e->items[0]);
  return e;
}

ExprPtr Parser::parse_math1() {
  ExprPtr e = parse_concat();
  while (is_op("+") || is_op("-")) {
    std::string op = next().value;
    e = binary(op, std::move(e), parse_concat());
  }
  return e;
}

ExprPtr Parser::parse_concat() {
  ExprPtr e = parse_math2();
  while (skip_op("~")) e = binary("~", std::move(e), parse_math2());
  return e;
}

ExprPtr Parser::parse_math2() {
  ExprPtr e = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    std::string op = next().value;
    e = binary(op, std::move(e), parse_pow());
  }
  return e;
}

ExprPtr Parser::parse_pow() {
  ExprPtr e = parse_unary(true);
  while (skip_op("**")) e = binary("**", std::move(e), parse_unary(true));
  return e;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  const Nesting guard(*this);
  ExprPtr e;
  if (is_op("-") || is_op("+")) {
    e = node(Expr::Kind::Unary, cur().line);
    e->name = next().value;
    e->items.push_back(parse_unary(false));
  } else {
    e = parse_primary();
  }
  e = parse_postfix(std::move(e));
  if (with_filter) e = parse_filters(std::move(e));
  return e;
}

ExprPtr Parser::parse_primary() {
  const Token tk = next();
  ExprPtr e = node(Expr::Kind::Literal, tk.line);
  switch (tk.type) {
    case T::Name:
      if (tk.value == "true" || tk.value == "True")
        e->value = Value::boolean(true);
      else if (tk.value == "false" || tk.value == "False")
        e->value = Value::boolean(false);
      else if (tk.value == "none" || tk.value == "None")
        e->value = Value::none();
      else {
        e->kind = Expr::Kind::Name;
        e->name = tk.value;
      }
      return e;
    case T::String: {
      std::string s = tk.value;
      while (cur().type == T::String) s += next().value;
      e->value = Value::string(std::move(s));
      return e;
    }
    case T::Int:
      e->value = Value::integer(int_literal(tk.value));
      return e;
    case T::Float:
      e->value = Value::number(std::strtod(tk.value.c_str(), nullptr));  // 1e999 -> inf, as Python
      return e;
    case T::Op:
      if (tk.value == "(") {
        ExprPtr inner = parse_tuple(true, true);
        expect_op(")");
        return inner;
      }
      if (tk.value == "[") {
        e->kind = Expr::Kind::List;
        while (!is_op("]")) {
          e->items.push_back(parse_expression());
          if (!skip_op(",")) break;
        }
        expect_op("]");
        return e;
      }
      if (tk.value == "{") {
        e->kind = Expr::Kind::Dict;
        while (!is_op("}")) {
          e->items.push_back(parse_expression());
          expect_op(":");
          e->items.push_back(parse_expression());
          if (!skip_op(",")) break;
        }
        expect_op("}");
        return e;
      }
      break;
    default:
      break;
  }
  --i_;
  error("unexpected '" + tk.value + "'");
}

ExprPtr Parser::parse_postfix(ExprPtr e) {
  while (true) {
    const int line = cur().line;
    if (skip_op(".")) {
      if (cur().type == T::Int) {
        auto item = node(Expr::Kind::Item, line);
        item->items.push_back(std::move(e));
        auto idx = node(Expr::Kind::Literal, line);
        idx->value = Value::integer(int_literal(next().value));
        item->items.push_back(std::move(idx));
        e = std::move(item);
      } else {
        auto attr = node(Expr::Kind::Attr, line);
        attr->name = expect_name();
        attr->items.push_back(std::move(e));
        e = std::move(attr);
      }
    } else if (skip_op("[")) {
      e = parse_subscript(std::move(e), line);
    } else if (is_op("(")) {
      e = parse_call(std::move(e));
    } else {
      return e;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr base, int line) {
  std::vector<ExprPtr> parts;
  bool slice = false;
  ExprPtr cur_part;
  while (!is_op("]")) {
    if (skip_op(":")) {
      slice = true;
      parts.push_back(std::move(cur_part));
      cur_part = nullptr;
    } else {
      cur_part = parse_expression();
    }
  }
  expect_op("]");
  parts.push_back(std::move(cur_part));
  auto e = node(slice ? Expr::Kind::Slice : Expr::Kind::Item, line);
  e->items.push_back(std::move(base));
  if (!slice && !parts[0]) error("expected a subscript");
  if (parts.size() > 3) error("too many ':' in a slice");
  for (auto& p : parts) e->items.push_back(std::move(p));
  while (slice && e->items.size() < 4) e->items.push_back(nullptr);
  return e;
}

std::vector<Arg> Parser::parse_args() {
  std::vector<Arg> args;
  expect_op("(");
  while (!is_op(")")) {
    Arg a;
    if (is_op("*") || is_op("**")) {
      a.name = next().value;
    } else if (cur().type == T::Name && peek().type == T::Op && peek().value == "=") {
      a.name = next().value;
      ++i_;
    }
    a.value = parse_expression();
    args.push_back(std::move(a));
    if (!skip_op(",")) break;
  }
  expect_op(")");
  return args;
}

ExprPtr Parser::parse_call(ExprPtr callee) {
  auto e = node(Expr::Kind::Call, callee->line);
  e->args = parse_args();
  e->items.push_back(std::move(callee));
  return e;
}

ExprPtr Parser::parse_filters(ExprPtr e) {
  while (true) {
    const int line = cur().line;
    if (skip_op("|")) {
      auto f = node(Expr::Kind::Filter, line);
      f->name = expect_name();
      while (skip_op(".")) f->name.append(".").append(expect_name());
      if (is_op("(")) f->args = parse_args();
      if (e) f->items.push_back(std::move(e));
      e = std::move(f);
    } else if (e && skip_name("is")) {
      auto t = node(Expr::Kind::Test, line);
      t->negated = skip_name("not");
      t->name = expect_name();
      if (is_op("(")) {
        t->args = parse_args();
      } else if ((cur().type == T::Name || cur().type == T::String || cur().type == T::Int ||
                  cur().type == T::Float || is_op("[") || is_op("{")) &&
                 !is_name("else") && !is_name("or") && !is_name("and")) {
        Arg a;
        a.value = parse_postfix(parse_primary());
        t->args.push_back(std::move(a));
      }
      t->items.push_back(std::move(e));
      e = std::move(t);
    } else if (e && is_op("(")) {
      e = parse_call(std::move(e));
    } else {
      return e;
    }
  }
}
}  // namespace lmx::chat
