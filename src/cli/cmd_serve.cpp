#include <cctype>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/json.h"
#include "hub/hub.h"
#include "server/server.h"

namespace lmx::cli {

namespace {

// A byte count, with an optional K, M or G (powers of 1024) suffix.
size_t parse_bytes(const std::string& v, const char* flag) {
  size_t used = 0;
  double n = -1;
  try {
    n = std::stod(v, &used);
  } catch (const std::exception&) {
  }
  double unit = 1;
  if (used > 0 && used + 1 == v.size()) {
    const char c = static_cast<char>(std::toupper(static_cast<unsigned char>(v.back())));
    unit = c == 'K' ? 1024.0 : c == 'M' ? 1048576.0 : c == 'G' ? 1073741824.0 : 0;
    if (unit > 0) ++used;
  }
  check(used == v.size() && used > 0 && n >= 0 && unit > 0, "serve", flag,
        " must be a byte count (suffix K, M or G allowed), got ", v);
  return static_cast<size_t>(n * unit);
}

// --memory-budget: GB (10^9 bytes) by default, or a number with a unit B, K, M, G (powers of 1000).
size_t parse_size_gb(const std::string& v) {
  size_t used = 0;
  double n = 0;
  try {
    n = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = v.substr(used);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const double scale = unit.empty() || unit == "G" || unit == "GB" ? 1e9
                       : unit == "M" || unit == "MB"               ? 1e6
                       : unit == "K" || unit == "KB"               ? 1e3
                       : unit == "B"                               ? 1
                                                                   : 0;
  check(used > 0 && scale > 0, "serve",
        "--memory-budget must be a size in GB (or with a unit B, K, M, G), got ", v);
  check(n > 0, "serve", "--memory-budget must be > 0 GB, got ", v);
  return static_cast<size_t>(n * scale);
}

}  // namespace

// mlx_lm.server's flags (same names and defaults), plus --api-key, --max-body-bytes.
int cmd_serve(const Args& args) {
  Flags f(
      "serve",
      "Serve the model over HTTP: OpenAI (/v1/chat/completions, /v1/completions, /v1/models) "
      "and Anthropic (/v1/messages) APIs.",
      {
          {"model",
           "model directory (MLX format) or Hugging Face repo id org/name[@rev]; repeatable: "
           "requests pick one by \"model\" (the first is the default)",
           false, "DIR|REPO"},
          {"models-dir", "serve every model directory (with a config.json) under DIR by its name",
           false, "DIR"},
          {"served-model-name", "another name of the first model; repeatable", false, "NAME"},
          {"max-loaded-models",
           "models loaded at once; past it the least recently used idle one is unloaded", false,
           "N", "the number of --model flags"},
          {"memory-budget",
           "memory for the models' weights and their requests' KV caches, in GB (or with a unit: "
           "B, K, M, G): a request whose KV at prompt + max_tokens would not fit gets 400 "
           "memory_admission; past it the least recently used idle model is unloaded",
           false, "SIZE", "off"},
          {"any-model-name", "answer requests naming an unknown model with the first model", true},
          {"request-timeout",
           "seconds a request may take, queued and generating; past it: 408 (streams: an error "
           "event)",
           false, "S", "none"},
          {"responses-ttl", "seconds a /v1/responses response is kept for previous_response_id",
           false, "S", "3600"},
          {"responses-max-bytes", "byte cap of the kept /v1/responses responses", false, "BYTES",
           "64M"},
          {"host", "address to listen on", false, "HOST", "127.0.0.1"},
          {"port", "port to listen on", false, "PORT", "8080"},
          {"max-tokens", "default maximum tokens per response", false, "N", "512"},
          {"temp", "default sampling temperature", false, "T", "0"},
          {"top-p", "default nucleus sampling threshold", false, "P", "1"},
          {"top-k", "default top-k (0 = off)", false, "K", "0"},
          {"min-p", "default min-p (0 = off)", false, "P", "0"},
          {"chat-template", "a chat template (file or text) replacing the model's", false, "T"},
          {"use-default-chat-template", "(accepted for mlx_lm compatibility)", true},
          {"chat-template-args",
           "JSON object of template arguments, e.g. "
           "'{\"enable_thinking\":false}'",
           false, "JSON", "{}"},
          adapter_path_flag(),
          {"adapter",
           "a LoRA adapter requests choose by name (\"adapter\": NAME, or \"model\": NAME); "
           "repeatable",
           false, "NAME=DIR"},
          {"adapter-root",
           "directory under which adapters may be loaded at run time (POST /v1/adapters, a "
           "request's \"adapters\" path)",
           false, "DIR", "none: off"},
          {"log-level", "DEBUG, INFO, WARNING, ERROR or CRITICAL", false, "L", "INFO"},
          {"api-key", "require 'Authorization: Bearer KEY' (or x-api-key)", false, "KEY"},
          {"max-body-bytes", "largest request body accepted", false, "N", "33554432"},
          {"prompt-cache-size", "prompt cache entries kept", false, "N", "10"},
          {"prompt-cache-bytes", "byte cap of the prompt cache", false, "N", "unlimited"},
          {"prefill-step-size", "prompt tokens a joining request prefills between two decode steps",
           false, "N", "512"},
          {"max-batch", "requests decoded together (continuous batching)", false, "N",
           "16 on the CPU, 64 on a GPU"},
          {"decode-concurrency", "mlx_lm.server's name for --max-batch", false, "N"},
          {"prompt-concurrency", "joining prompts prefilled at once", false, "N", "1"},
          {"max-queue", "requests waiting past which the server answers 429", false, "N",
           "unlimited"},
          {"http-threads", "HTTP worker threads", false, "N", "32"},
          {"exact", "tier L1: stock MLX ops, bit-exact with mlx-lm (default: the fast tier L3)",
           true},
          {"trust-remote-code", "(accepted for mlx_lm compatibility; no code is run)", true},
          offline_flag(),
      });
  for (auto& spec : kv_cache_flags()) f.add(spec);
  for (auto& spec : speculative_flags()) f.add(spec);
  if (!f.parse(args)) {
    std::fputs(f.usage().c_str(), stdout);
    return 0;
  }
  server::ServerOptions o;
  check(f.has("model") || f.has("models-dir"), "serve",
        "no model given, expected --model or --models-dir");
  hub::HubOptions hub_options;
  if (f.on("offline")) hub_options.offline = true;
  const std::vector<std::string> models = f.all("model");
  for (size_t i = 0; i < models.size(); ++i) {
    // As given: a repo id stays the model's name.
    const std::filesystem::path dir = hub::resolve_model(models[i], hub_options);
    if (i == 0) {
      o.model_id = models[i];
      o.model = dir;
    } else {
      o.more_models.emplace_back(models[i], dir);
    }
  }
  if (f.has("models-dir")) {
    o.models_dir = f.str("models-dir");
    check(std::filesystem::is_directory(*o.models_dir), "serve", "--models-dir '",
          o.models_dir->string(), "' is not a directory");
  }
  o.served_model_names = f.all("served-model-name");
  o.max_loaded_models = f.integer("max-loaded-models", 0);
  check(!f.has("max-loaded-models") || o.max_loaded_models >= 1, "serve",
        "--max-loaded-models must be >= 1, got ", o.max_loaded_models);
  if (f.has("memory-budget")) {
    o.memory_budget = parse_size_gb(f.str("memory-budget"));
    o.scheduler.memory_budget = o.memory_budget;
  }
  o.any_model_name = f.on("any-model-name");
  o.request_timeout = f.integer("request-timeout", 0);
  check(o.request_timeout >= 0, "serve", "--request-timeout must be >= 0, got ",
        o.request_timeout);
  o.responses_ttl_seconds = f.integer("responses-ttl", 3600);
  check(o.responses_ttl_seconds >= 0, "serve", "--responses-ttl must be >= 0, got ",
        o.responses_ttl_seconds);
  if (f.has("responses-max-bytes"))
    o.responses_max_bytes = parse_bytes(f.str("responses-max-bytes"), "--responses-max-bytes");
  o.adapter_path = adapter_path(f);
  for (const std::string& a : f.all("adapter")) {
    const size_t eq = a.find('=');
    check(eq != std::string::npos && eq > 0 && eq + 1 < a.size(), "serve",
          "--adapter must be NAME=DIR, got '", a, "'");
    o.adapters.emplace_back(a.substr(0, eq), a.substr(eq + 1));
  }
  if (f.has("draft-model")) o.draft_model = resolve_model_flag(f, "draft-model");
  o.prompt_lookup = f.integer("prompt-lookup", 0);
  o.num_draft_tokens = f.integer("num-draft-tokens", 3);
  // A DFlash drafter fills its whole block unless told otherwise.
  if (o.draft_model && !f.has("num-draft-tokens") && is_dflash_drafter(*o.draft_model))
    o.num_draft_tokens = dflash_block_size(*o.draft_model) - 1;
  check(!(f.has("draft-model") && f.has("prompt-lookup")), "serve",
        "--draft-model and --prompt-lookup were both given, expected one");
  check(!f.has("prompt-lookup") || o.prompt_lookup >= 1, "serve",
        "--prompt-lookup must be >= 1, got ", o.prompt_lookup);
  check(o.num_draft_tokens >= 1, "serve", "--num-draft-tokens must be >= 1, got ",
        o.num_draft_tokens);
  check(!f.has("num-draft-tokens") || f.has("draft-model") || f.has("prompt-lookup"), "serve",
        "--num-draft-tokens needs --draft-model or --prompt-lookup");
  if (f.has("adapter-root")) {
    o.adapter_root = f.str("adapter-root");
    check(std::filesystem::is_directory(*o.adapter_root), "serve", "--adapter-root '",
          o.adapter_root->string(), "' is not a directory");
  }
  o.exact = f.on("exact");
  o.host = f.str("host", "127.0.0.1");
  o.port = f.integer("port", 8080);
  check(o.port > 0 && o.port < 65536, "serve", "--port must be 1-65535, got ", o.port);
  o.defaults.max_tokens = f.integer("max-tokens", 512);
  o.defaults.temp = f.number("temp", 0.0f);
  o.defaults.top_p = f.number("top-p", 1.0f);
  o.defaults.top_k = f.integer("top-k", 0);
  o.defaults.min_p = f.number("min-p", 0.0f);
  o.defaults.prefill_step_size = f.integer("prefill-step-size", 512);
  o.scheduler.prefill_step_size = o.defaults.prefill_step_size;
  check(o.scheduler.prefill_step_size > 0, "serve", "--prefill-step-size must be > 0, got ",
        o.scheduler.prefill_step_size);
  check(!(f.has("max-batch") && f.has("decode-concurrency")), "serve",
        "--max-batch and --decode-concurrency are one setting, expected one of them");
  o.scheduler.max_batch =
      f.has("decode-concurrency") ? f.integer("decode-concurrency", 0) : f.integer("max-batch", 0);
  check(o.scheduler.max_batch >= 0, "serve",
        "--max-batch must be >= 1 (0: the backend default), got ", o.scheduler.max_batch);
  o.scheduler.prompt_concurrency = f.integer("prompt-concurrency", 1);
  check(o.scheduler.prompt_concurrency >= 1, "serve", "--prompt-concurrency must be >= 1, got ",
        o.scheduler.prompt_concurrency);
  o.scheduler.max_queue = f.integer("max-queue", 0);
  check(o.scheduler.max_queue >= 0, "serve", "--max-queue must be >= 0, got ",
        o.scheduler.max_queue);
  o.kv_config = f.str("kv-config");
  o.defaults.kv_bits = f.opt_integer("kv-bits");
  o.defaults.kv_group_size = f.integer("kv-group-size", 64);
  o.defaults.quantized_kv_start = f.integer("quantized-kv-start", 5000);
  o.chat_template = f.str("chat-template");
  o.chat_template_args = f.str("chat-template-args", "{}");
  o.log_level = f.str("log-level", "INFO");
  o.api_key = f.str("api-key");
  const int body = f.integer("max-body-bytes", 32 << 20);
  check(body > 0, "serve", "--max-body-bytes must be > 0");
  o.max_body_bytes = static_cast<size_t>(body);
  o.prompt_cache_entries = static_cast<size_t>(std::max(0, f.integer("prompt-cache-size", 10)));
  if (f.has("prompt-cache-bytes"))
    o.prompt_cache_bytes = parse_bytes(f.str("prompt-cache-bytes"), "--prompt-cache-bytes");
  o.http_threads = f.integer("http-threads", 32);
  check(o.http_threads > 0, "serve", "--http-threads must be > 0");
  return server::serve(o);
}

}  // namespace lmx::cli
