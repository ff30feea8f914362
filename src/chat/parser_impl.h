// The template parser's class, shared by parser.cpp (statements) and parse_expr.cpp (expressions).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "chat/ast.h"
#include "chat/lexer.h"
#include "chat/template_error.h"

namespace lmx::chat {

// Recursive descent over jinja2's grammar (jinja2/parser.py precedence: condexpr < or < and < not
// < compare < + - < ~ < * / // % < ** < unary, then postfix . [] (), then filters and tests).
class Parser {
  using T = Token::Type;

 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse_template();

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == T::Op && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == T::Name && cur().value == n; }
  [[noreturn]] void error(const std::string& what) const { throw TemplateError(what, cur().line); }
  Token next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++i_;
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) error(std::string("expected '") + op + "', got '" + cur().value + "'");
  }
  std::string expect_name() {
    if (cur().type != T::Name) error("expected a name, got '" + cur().value + "'");
    return next().value;
  }
  void expect_block_end() {
    if (cur().type != T::BlockEnd)
      error("expected end of statement block, got '" + cur().value + "'");
    ++i_;
  }
  ExprPtr node(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // Statements until one of `ends` (a block tag name); `end` receives it ("" at end of input).
  Body parse_body(const std::set<std::string>& ends, std::string& end);

  std::unique_ptr<Stmt> parse_statement();

  std::vector<std::string> parse_targets();

  std::vector<MacroParam> parse_params();

  // Expression, or a tuple when commas follow (jinja2's parse_tuple).
  ExprPtr parse_tuple(bool with_condexpr = true, bool explicit_parens = false);

  ExprPtr parse_expression();

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b);

  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);

  ExprPtr parse_primary();
  int64_t int_literal(const std::string& digits) const;

  ExprPtr parse_postfix(ExprPtr e);

  ExprPtr parse_subscript(ExprPtr base, int line);

  std::vector<Arg> parse_args();

  ExprPtr parse_call(ExprPtr callee);

  // `| name(args)` filters and `is [not] name args` tests after a value (null: filter block).
  ExprPtr parse_filters(ExprPtr e);

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;

  // Bounds the recursion, so that hostile input gets an error instead of a stack overflow.
  struct Nesting {
    explicit Nesting(Parser& p) : p(p) {
      if (++p.depth_ > kMaxNesting) p.error("template nested too deeply");
    }
    ~Nesting() { --p.depth_; }
    Parser& p;
  };
  static constexpr int kMaxNesting = 300;
};

}  // namespace lmx::chat
