// Recursive descent over jinja2's grammar (jinja2/parser.py precedence: condexpr < or < and < not
// < compare < + - < ~ < * / // % < ** < unary, then postfix . [] (), then filters and tests).
#include <set>

#include "chat/ast.h"
#include "chat/lexer.h"
#include "chat/template_error.h"

namespace lmx::chat {

namespace {

using T = Token::Type;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  Body parse_template() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

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
    if (cur().type != T::BlockEnd) error("expected end of statement block, got '" + cur().value + "'");
    ++i_;
  }
  ExprPtr node(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // Statements until one of `ends` (a block tag name); `end` receives it ("" at end of input).
  Body parse_body(const std::set<std::string>& ends, std::string& end) {
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == T::Eof) {
        if (!ends.empty()) error("unexpected end of template, expected '" + *ends.begin() + "'");
        end.clear();
        return body;
      }
      if (tk.type == T::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Text;
        s->line = tk.line;
        s->text = tk.value;
        body.push_back(std::move(s));
        ++i_;
      } else if (tk.type == T::VarBegin) {
        ++i_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Output;
        s->line = tk.line;
        s->expr = parse_tuple();
        if (cur().type != T::VarEnd) error("expected end of print statement, got '" + cur().value + "'");
        ++i_;
        body.push_back(std::move(s));
      } else if (tk.type == T::BlockBegin) {
        ++i_;
        if (cur().type == T::Name && ends.count(cur().value)) {
          end = next().value;
          return body;
        }
        body.push_back(parse_statement());
      } else {
        error("unexpected '" + tk.value + "'");
      }
    }
  }

  std::unique_ptr<Stmt> parse_statement() {
    const Nesting guard(*this);
    auto s = std::make_unique<Stmt>();
    s->line = cur().line;
    const std::string kw = expect_name();
    std::string end;
    if (kw == "if") {
      s->kind = Stmt::Kind::If;
      s->conds.push_back(parse_tuple());
      expect_block_end();
      while (true) {
        s->bodies.push_back(parse_body({"elif", "else", "endif"}, end));
        if (end == "elif") {
          s->conds.push_back(parse_tuple());
          expect_block_end();
        } else if (end == "else") {
          expect_block_end();
          s->else_body = parse_body({"endif"}, end);
          break;
        } else {
          break;
        }
      }
    } else if (kw == "for") {
      s->kind = Stmt::Kind::For;
      s->targets = parse_targets();
      if (!skip_name("in")) error("expected 'in' in for loop");
      s->expr = parse_tuple(false);
      if (skip_name("if")) s->cond = parse_expression();
      if (skip_name("recursive")) error("recursive for loops are not supported");
      expect_block_end();
      s->body = parse_body({"endfor", "else"}, end);
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, end);
      }
    } else if (kw == "set") {
      if (cur().type == T::Name && peek().type == T::Op && peek().value == ".") {
        s->kind = Stmt::Kind::Set;
        s->target = node(Expr::Kind::Attr, cur().line);
        auto base = node(Expr::Kind::Name, cur().line);
        base->name = next().value;
        ++i_;  // '.'
        s->target->name = expect_name();
        s->target->items.push_back(std::move(base));
        expect_op("=");
        s->expr = parse_tuple();
      } else {
        s->targets = parse_targets();
        if (skip_op("=")) {
          s->kind = Stmt::Kind::Set;
          s->expr = parse_tuple();
        } else {
          s->kind = Stmt::Kind::SetBlock;
          if (s->targets.size() != 1) error("block set takes one name");
          if (is_op("|")) s->expr = parse_filters(nullptr);
          expect_block_end();
          s->body = parse_body({"endset"}, end);
        }
      }
    } else if (kw == "macro") {
      s->kind = Stmt::Kind::Macro;
      s->text = expect_name();
      s->params = parse_params();
      expect_block_end();
      s->body = parse_body({"endmacro"}, end);
      if (cur().type == T::Name) ++i_;  // {% endmacro name %}
    } else if (kw == "call") {
      s->kind = Stmt::Kind::CallBlock;
      if (is_op("(")) s->params = parse_params();
      s->expr = parse_expression();
      if (s->expr->kind != Expr::Kind::Call) error("expected a call after 'call'");
      expect_block_end();
      s->body = parse_body({"endcall"}, end);
    } else if (kw == "filter") {
      s->kind = Stmt::Kind::FilterBlock;
      --i_;  // parse_filters expects to start on the first filter name
      t_[i_] = Token{T::Op, "|", t_[i_].line};
      s->expr = parse_filters(nullptr);
      expect_block_end();
      s->body = parse_body({"endfilter"}, end);
    } else if (kw == "break" || kw == "continue") {
      s->kind = kw == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
    } else if (kw == "generation") {
      s->kind = Stmt::Kind::Scope;
      expect_block_end();
      s->body = parse_body({"endgeneration"}, end);
    } else if (kw == "with") {
      s->kind = Stmt::Kind::Scope;
      s->text = "with";
      while (cur().type == T::Name) {
        std::string name = next().value;
        expect_op("=");
        s->with_vars.emplace_back(name, parse_expression());
        if (!skip_op(",")) break;
      }
      expect_block_end();
      s->body = parse_body({"endwith"}, end);
    } else {
      i_--;
      error("unsupported or unknown tag '" + kw + "'");
    }
    expect_block_end();
    return s;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    do {
      if (paren && is_op(")")) break;
      names.push_back(expect_name());
    } while (skip_op(","));
    if (paren) expect_op(")");
    return names;
  }

  std::vector<MacroParam> parse_params() {
    std::vector<MacroParam> params;
    expect_op("(");
    while (!is_op(")")) {
      MacroParam p;
      p.name = expect_name();
      if (skip_op("=")) p.default_value = parse_expression();
      params.push_back(std::move(p));
      if (!skip_op(",")) break;
    }
    expect_op(")");
    return params;
  }

  // Expression, or a tuple when commas follow (jinja2's parse_tuple).
  ExprPtr parse_tuple(bool with_condexpr = true, bool explicit_parens = false) {
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
    if (items.empty() && !explicit_parens) error("expected an expression");
    auto e = node(Expr::Kind::Tuple, line);
    e->items = std::move(items);
    return e;
  }

  ExprPtr parse_expression() {
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

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b) {
    auto e = node(Expr::Kind::Binary, a->line);
    e->name = op;
    e->items.push_back(std::move(a));
    e->items.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (skip_name("or")) e = binary("or", std::move(e), parse_and());
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (skip_name("and")) e = binary("and", std::move(e), parse_not());
    return e;
  }
  ExprPtr parse_not() {
    const Nesting guard(*this);
    if (is_name("not")) {
      auto e = node(Expr::Kind::Unary, next().line);
      e->name = "not";
      e->items.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
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
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().value;
      e = binary(op, std::move(e), parse_concat());
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (skip_op("~")) e = binary("~", std::move(e), parse_math2());
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().value;
      e = binary(op, std::move(e), parse_pow());
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (skip_op("**")) e = binary("**", std::move(e), parse_unary(true));
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
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

  ExprPtr parse_primary() {
    const Token tk = next();
    ExprPtr e = node(Expr::Kind::Literal, tk.line);
    switch (tk.type) {
      case T::Name:
        if (tk.value == "true" || tk.value == "True") e->value = Value::boolean(true);
        else if (tk.value == "false" || tk.value == "False") e->value = Value::boolean(false);
        else if (tk.value == "none" || tk.value == "None") e->value = Value::none();
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
      case T::Int: e->value = Value::integer(std::stoll(tk.value)); return e;
      case T::Float: e->value = Value::number(std::stod(tk.value)); return e;
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
      default: break;
    }
    --i_;
    error("unexpected '" + tk.value + "'");
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const int line = cur().line;
      if (skip_op(".")) {
        if (cur().type == T::Int) {
          auto item = node(Expr::Kind::Item, line);
          item->items.push_back(std::move(e));
          auto idx = node(Expr::Kind::Literal, line);
          idx->value = Value::integer(std::stoll(next().value));
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

  ExprPtr parse_subscript(ExprPtr base, int line) {
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

  std::vector<Arg> parse_args() {
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

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(Expr::Kind::Call, callee->line);
    e->args = parse_args();
    e->items.push_back(std::move(callee));
    return e;
  }

  // `| name(args)` filters and `is [not] name args` tests after a value (null: filter block).
  ExprPtr parse_filters(ExprPtr e) {
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

}  // namespace

Body parse(const std::string& source) { return Parser(lex(source)).parse_template(); }

}  // namespace lmx::chat
