// `lmx serve`: an OpenAI and Anthropic compatible HTTP server over one model (drop-in for
// mlx_lm.server's flags and endpoints).
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/requests.h"

namespace lmx::server {

struct ServerOptions {
  // The first --model (the default model: requests with no or an unknown-but-allowed name).
  std::filesystem::path model;
  std::string model_id;  // the --model reference as given (a directory or a repo id)
  // Further --model flags: (the reference as given, its directory). --adapter, --adapter-path
  // and --draft-model apply to the first model only.
  std::vector<std::pair<std::string, std::filesystem::path>> more_models;
  std::optional<std::filesystem::path> models_dir;  // every subdirectory with a config.json
  std::vector<std::string> served_model_names;      // other names of the first model
  int max_loaded_models = 0;                        // 0: as many as --model flags (at least 1)
  std::optional<size_t> memory_budget;  // --memory-budget: bytes of weights loaded at once
  bool any_model_name = false;          // unknown model names get the first model instead of a 404
  int request_timeout = 0;  // --request-timeout: seconds a request may take in all; 0: no limit
  // /v1/responses kept for previous_response_id and GET /v1/responses/{id}.
  int responses_ttl_seconds = 3600;
  size_t responses_max_bytes = size_t{64} << 20;
  bool exact = false;  // --exact: tier L1
  // --adapter-path: an mlx-lm LoRA adapter directory
  std::optional<std::filesystem::path> adapter_path;
  // --adapter NAME=DIR (repeatable): adapters chosen per request by name.
  std::vector<std::pair<std::string, std::filesystem::path>> adapters;
  // --adapter-root: adapters loaded at run time (POST /v1/adapters, a request's `adapters`
  // path) must lie under it; unset: none can be.
  std::optional<std::filesystem::path> adapter_root;
  // --draft-model DIR / --prompt-lookup N, --num-draft-tokens K: speculative decoding for every
  // request that can take it (docs/speculative.md).
  std::optional<std::filesystem::path> draft_model;
  int prompt_lookup = 0;
  int num_draft_tokens = 3;
  std::string host = "127.0.0.1";
  int port = 8080;
  SamplingDefaults defaults;
  std::string chat_template;              // --chat-template: a file or the template text
  std::string chat_template_args = "{}";  // --chat-template-args: JSON object
  std::string api_key;                    // empty: no authentication
  size_t max_body_bytes = 32u << 20;
  size_t prompt_cache_entries = 10;
  std::optional<size_t> prompt_cache_bytes;
  int http_threads = 32;
  // --max-batch, --prompt-concurrency, --max-queue, --prefill-step-size.
  SchedulerOptions scheduler;
  std::string kv_config;  // --kv-config: a kv_config.json, "off", or empty for the model's own
  std::string log_level = "INFO";
};

// Whether `given` equals the API key, in a time that depends on the key's length only (no early
// exit at the first differing byte), so response times do not reveal a guessed prefix.
bool same_secret(std::string_view given, std::string_view key);

// Loads the model, serves until SIGINT or SIGTERM, then finishes open responses and returns 0.
int serve(const ServerOptions& options);

}  // namespace lmx::server
