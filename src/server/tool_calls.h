// Tool calls in each model family's native output format, parsed into OpenAI function calls.
//   hermes  <tool_call>{"name": ..., "arguments": {...}}</tool_call>   (Qwen 2.5/3, Hermes,
//   SmolLM3) llama3  <|python_tag|>{"name": ..., "parameters": {...}} or a bare JSON object as the
//   output mistral [TOOL_CALLS][{"name": ..., "arguments": {...}}] or [TOOL_CALLS]name[ARGS]{...}
//   gemma   <start_function_call>call:name{key:<escape>text<escape>,n:1}<end_function_call>
//   gemma4  <|tool_call>call:name{key:<|"|>text<|"|>,n:1}<tool_call|>
//   qwen3_coder  <tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>\n</function>\n
//           </tool_call>   (Qwen3.5, Qwen3-Coder; values typed by the tool's JSON schema)
//   harmony <|channel|>commentary to=functions.name <|constrain|>json<|message|>{...}<|call|>
//           (gpt-oss; also `to=functions.name` before <|channel|>, in the role header)
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/text_stream.h"

namespace lmx::server {

using ojson = nlohmann::ordered_json;

// kHarmony (gpt-oss): the analysis channel is the reasoning, the final channel the content, a
// message addressed `to=functions.NAME` a tool call.
enum class ToolFormat { kNone, kHermes, kLlama3, kMistral, kGemma, kGemma4, kHarmony, kQwen3Coder };

// Which format a chat template speaks, from the markers its source mentions.
ToolFormat detect_tool_format(const std::string& template_source);
const char* tool_format_name(ToolFormat f);
OutputSplitter::Markers output_markers(ToolFormat f);

struct ToolCall {
  std::string id;  // the model's own id when it gave one, else empty
  std::string name;
  std::string arguments;  // a JSON object, serialized
};

// Parses one raw block (the text between the format's markers; harmony's starts with its header).
// Returns no calls when the block is not a well-formed tool call; the caller then keeps it as
// content. `tools` (the request's OpenAI tools) types qwen3_coder's parameter values.
std::vector<ToolCall> parse_tool_block(ToolFormat f, const std::string& block,
                                       const ojson& tools = {});

// llama3: a whole output that is one JSON object {"name", "parameters"|"arguments"}.
std::vector<ToolCall> parse_bare_json_call(const std::string& text);

}  // namespace lmx::server
