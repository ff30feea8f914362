// Syntax tree of a parsed template: expressions and statements as jinja2's parser builds them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/value.h"

namespace lmx::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Arg {
  std::string name;  // empty: positional
  ExprPtr value;
};

struct Expr {
  enum class Kind {
    Literal,  // value
    Name,     // name
    List,     // items
    Tuple,    // items
    Dict,     // items: key, value, key, value, ...
    Attr,     // items[0].name
    Item,     // items[0][items[1]]
    Slice,    // items[0][items[1]:items[2]:items[3]] (null entries for omitted parts)
    Call,     // items[0](args)
    Filter,   // items[0] | name(args); items empty for `{% filter %}` blocks
    Test,     // items[0] is [not] name(args); negated
    Unary,    // name ("-", "+", "not") items[0]
    Binary,   // items[0] name items[1] for + - * / // % ** ~ and or
    Compare,  // items[0] ops[0] items[1] ops[1] items[2] ...
    Cond,     // items[1] if items[0] else items[2] (items[2] may be null)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> items;
  std::vector<Arg> args;
  std::vector<std::string> ops;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null when required
};

struct Stmt {
  enum class Kind {
    Text,         // text
    Output,       // {{ expr }}
    If,           // conds[k] -> bodies[k]; else_body
    For,          // for targets in expr [if cond] body [else else_body]
    Set,          // set targets = expr, or set expr(Attr target) = value (namespace attribute)
    SetBlock,     // set targets[0] [| filter] body endset
    Macro,        // macro name(params) body
    CallBlock,    // call(params) expr body
    FilterBlock,  // filter chain (expr: Filter nodes whose innermost items are empty) body
    Break,
    Continue,
    Scope,  // generation / with: body rendered in place (with adds a scope)
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;    // output, for iterable, set value, call target, block-set filter
  ExprPtr cond;    // for-if filter
  ExprPtr target;  // namespace attribute target of a set
  std::vector<std::string> targets;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body, else_body;
  std::vector<MacroParam> params;
  std::vector<std::pair<std::string, ExprPtr>> with_vars;  // {% with a = 1 %}
};

// Parses tokens from lex() into the template's top-level statements. Throws TemplateError.
Body parse(const std::string& source);

}  // namespace lmx::chat
