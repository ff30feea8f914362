// Errors raised while lexing, parsing or rendering a template. ChatTemplate turns them into
// lmx::Error naming the template and the line (jinja2's TemplateSyntaxError / TemplateError).
#pragma once

#include <stdexcept>
#include <string>

namespace lmx::chat {

class TemplateError : public std::runtime_error {
 public:
  explicit TemplateError(const std::string& what, int line = 0)
      : std::runtime_error(what), line(line) {}
  int line;  // 1-based template line, 0 when not known yet
};

}  // namespace lmx::chat
