// Renders a parsed template: scopes as jinja2 has them (a for-loop iteration and a macro call get
// their own; if/else do not), loop variables, macros and call blocks, break/continue.
#pragma once

#include <string>

#include "chat/ast.h"
#include "chat/value.h"

namespace lmx::chat {

// `vars` are the render variables (messages, tools, add_generation_prompt, bos_token, ...).
// Throws TemplateError with the line of the failing statement.
std::string render(const Body& program, const Dict& vars);

}  // namespace lmx::chat
