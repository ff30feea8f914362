// Statements: {% if %}, {% for %}, {% set %}, {% macro %}, {% call %}, {% filter %}, ...
#include <set>

#include "chat/parser_impl.h"

namespace lmx::chat {

using T = Token::Type;

Body Parser::parse_template() {
  std::string end;
  Body body = parse_body({}, end);
  return body;
}

Body Parser::parse_body(const std::set<std::string>& ends, std::string& end) {
  Body body;
  while (true) {
    const Token& tk = cur();
    if (tk.type == T::Eof) {
      if (!ends.empty()) {
        std::string want;
        for (const std::string& e : ends) want += (want.empty() ? "'" : " or '") + e + "'";
        error("unexpected end of template, expected " + want);
      }
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
      if (cur().type != T::VarEnd)
        error("expected end of print statement, got '" + cur().value + "'");
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

std::unique_ptr<Stmt> Parser::parse_statement() {
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

std::vector<std::string> Parser::parse_targets() {
  std::vector<std::string> names;
  const bool paren = skip_op("(");
  do {
    if (paren && is_op(")")) break;
    names.push_back(expect_name());
  } while (skip_op(","));
  if (paren) expect_op(")");
  return names;
}

std::vector<MacroParam> Parser::parse_params() {
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
Body parse(const std::string& source) { return Parser(lex(source)).parse_template(); }

}  // namespace lmx::chat
