// Template source to tokens, with jinja2's whitespace control as transformers configures it:
// trim_blocks and lstrip_blocks on, `-` / `+` modifiers, newlines normalized to "\n" and one
// trailing newline dropped (keep_trailing_newline off).
#pragma once

#include <string>
#include <vector>

namespace lmx::chat {

struct Token {
  enum class Type {
    Text,
    VarBegin,
    VarEnd,
    BlockBegin,
    BlockEnd,
    Name,
    String,
    Int,
    Float,
    Op,
    Eof
  };
  Type type;
  std::string value;
  int line;
};

std::vector<Token> lex(const std::string& source);

}  // namespace lmx::chat
