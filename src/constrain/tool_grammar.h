// Grammars that force tool calls in a model family's text format: each call is
// open + {"name": "<tool>", "<arguments key>": <a value of the tool's grammar>} + close, written
// exactly so (the JSON compact but for the ": " and ", " shown), for tool_choice required or a
// named function.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "constrain/json_grammar.h"

namespace lmx::constrain {

struct ToolCallSyntax {
  std::string open;       // before the call's object, e.g. "<tool_call>\n"
  std::string close;      // after it, e.g. "\n</tool_call>"
  std::string separator;  // between calls; empty: one call at most
  std::string arguments_key = "arguments";
};

// One call of one of `tools` (name, arguments grammar); with `parallel` and a separator, one or
// more calls. Throws lmx::Error for an empty list.
Grammar tool_call_grammar(const std::vector<std::pair<std::string, Grammar>>& tools,
                          const ToolCallSyntax& syntax, bool parallel);

// `text` verbatim, then a value of `g` (a prompt that ends inside an open <think>: the constraint
// closes it first, so that the value lands in the answer). Empty text: `g` unchanged.
Grammar after_text(const std::string& text, Grammar g);

}  // namespace lmx::constrain
