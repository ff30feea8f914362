// Request bodies of the OpenAI and Anthropic endpoints parsed into typed requests; every bad
// field is an ApiError(400) naming it. The Anthropic request is converted to the OpenAI form
// the chat template takes.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lmx/lmx.h"

namespace lmx::server {

using ojson = nlohmann::ordered_json;

// The server's flags that requests fall back to (mlx_lm.server's --max-tokens, --temp, ...).
struct SamplingDefaults {
  int max_tokens = 512;
  float temp = 0.0f, top_p = 1.0f, min_p = 0.0f;
  int top_k = 0;
  int prefill_step_size = 2048;
  std::optional<int> kv_bits;
  int kv_group_size = 64;
  int quantized_kv_start = 5000;
};

struct SamplingRequest {
  std::string model;
  // A LoRA adapter loaded by name (`adapter`, lmx's field; `model` naming an adapter also picks
  // it), or mlx_lm.server's `adapters`: an adapter directory.
  std::string adapter;
  std::optional<std::string> adapter_path;
  // Speculative decoding of a server started with --draft-model / --prompt-lookup: `speculative`
  // false opts out; mlx_lm.server's `num_draft_tokens` sets K.
  std::optional<bool> speculative;
  std::optional<int> num_draft_tokens;
  GenerateOptions gen;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int top_logprobs = -1;       // -1: no logprobs
  // response_format: json_object (any JSON object) or json_schema's schema; neither: free text.
  bool json_object = false;
  std::optional<ojson> json_schema;
};

struct ChatRequest {
  SamplingRequest s;
  ojson messages = ojson::array();  // OpenAI form, the client's key order kept
  std::optional<ojson> tools;
  std::string tool_choice = "auto";  // "auto", "none", "required" or "function"
  std::string tool_name;             // tool_choice "function": the function to call
  bool parallel_tool_calls = true;   // required: more than one call may follow
  ojson template_kwargs = ojson::object();
};

struct CompletionRequest {
  SamplingRequest s;
  std::optional<std::string> prompt;
  std::vector<int> prompt_tokens;  // a prompt given as token ids
  bool echo = false;
};

// POST /v1/embeddings: each input as text or as token ids (taken as they are).
struct EmbeddingRequest {
  std::string model;
  std::vector<std::string> texts;           // input given as text
  std::vector<std::vector<int>> token_ids;  // input given as token ids
  bool base64 = false;                      // encoding_format base64: float32 little-endian
  std::optional<int> dimensions;
};

ChatRequest parse_chat_request(const ojson& body, const SamplingDefaults& d);
CompletionRequest parse_completion_request(const ojson& body, const SamplingDefaults& d);
// POST /v1/messages. thinking {type: enabled} turns on enable_thinking.
ChatRequest parse_anthropic_request(const ojson& body, const SamplingDefaults& d);

EmbeddingRequest parse_embedding_request(const ojson& body);

// The body as a JSON object, or ApiError(400).
ojson parse_body(const std::string& body);

}  // namespace lmx::server
