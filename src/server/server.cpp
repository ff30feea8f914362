#include "server/server.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <thread>

#include "constrain/tool_grammar.h"
#include "core/error.h"
#include "sampling/sampler.h"
#include "server/api_error.h"
#include "server/chat_page.h"
#include "server/context.h"
#include "server/metrics.h"
#include "server/models.h"

namespace lmx::server {

bool same_secret(std::string_view given, std::string_view key) {
  // volatile: keeps the compiler from turning the loop into an early-exit compare.
  volatile unsigned char diff = given.size() == key.size() ? 0 : 1;
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff = diff | (g ^ static_cast<unsigned char>(key[i]));
  }
  return diff == 0;
}

void check_model(const Context& ctx, const std::string& model) {
  // mlx_lm.server answers any name with its loaded model; so do we for its placeholder name.
  if (model.empty() || model == "default_model" || model == ctx.model_id ||
      model == ctx.options.model.string() || ctx.engine->has_adapter(model) || ctx.any_name ||
      std::find(ctx.aliases.begin(), ctx.aliases.end(), model) != ctx.aliases.end())
    return;
  throw ApiError(404,
                 "The model '" + model + "' does not exist; this server has '" + ctx.model_id + "'",
                 "model", "invalid_request_error", "model_not_found");
}

std::shared_ptr<Job> make_job(const Context& ctx, std::vector<int> prompt, const SamplingRequest& s,
                              const std::string& prompt_field,
                              const std::string& constraint_prefix) {
  if (prompt.empty()) bad_field(prompt_field, "gives an empty prompt");
  const int vocab = ctx.engine->vocab_size();
  for (int t : prompt)
    if (t < 0 || t >= vocab)
      bad_field(prompt_field, "has token id " + std::to_string(t) + " outside the vocabulary");
  for (const auto& [id, bias] : s.gen.processors.logit_bias)
    if (id >= vocab)
      bad_field("logit_bias", "has token id " + std::to_string(id) + " outside the vocabulary");
  if (s.gen.sampler.top_k >= vocab) bad_field("top_k", "must be smaller than the vocabulary");
  try {
    // The sampler's own checks, so that nothing the engine would refuse gets queued.
    validate(s.gen.sampler, vocab);
    validate(s.gen.processors);
  } catch (const lmx::Error& e) {
    throw ApiError(400, e.what());
  }
  if (auto n = ctx.engine->info().max_position_embeddings) {
    if (static_cast<long>(prompt.size()) + s.gen.max_tokens > *n)
      throw ApiError(400,
                     "This model's maximum context length is " + std::to_string(*n) +
                         " tokens; the prompt has " + std::to_string(prompt.size()) +
                         " tokens and max_tokens asks for " + std::to_string(s.gen.max_tokens),
                     prompt_field, "invalid_request_error", "context_length_exceeded");
  }
  auto job = std::make_shared<Job>();
  if (ctx.options.request_timeout > 0) {
    job->timeout_seconds = ctx.options.request_timeout;
    job->deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(ctx.options.request_timeout);
  }
  job->prompt = std::move(prompt);
  job->options = s.gen;
  job->options.adapter = resolve_adapter(ctx, s);
  if (ctx.kv_config) job->options.kv_config = ctx.kv_config;
  if (s.num_draft_tokens && !ctx.engine->draft_model() && !ctx.engine->dflash() &&
      ctx.options.prompt_lookup == 0)
    bad_field("num_draft_tokens", "needs a server started with --draft-model or --prompt-lookup");
  job->top_logprobs = s.top_logprobs;
  if (s.json_object || s.json_schema) {
    constrain::Grammar g;
    if (s.json_schema) {
      try {
        g = constrain::compile_schema(json::parse(s.json_schema->dump()));
      } catch (const lmx::Error& e) {
        bad_field("response_format.json_schema.schema", e.what());
      }
    } else {
      g = constrain::any_json_grammar(/*object_only=*/true);
    }
    job->options.constraint = std::make_shared<constrain::JsonConstraint>(
        ctx.engine->token_table(), constrain::after_text(constraint_prefix, std::move(g)),
        ctx.engine->eos_ids());
  }
  speculate(ctx, s, *job);
  return job;
}

void speculate(const Context& ctx, const SamplingRequest& s, Job& job) {
  // Speculation needs to roll the sampled tokens back: processors and constraints (JSON, forced
  // tool calls) see each token once, so those requests decode plainly.
  job.options.draft_model = nullptr;
  job.options.dflash = nullptr;
  job.options.prompt_lookup = 0;
  if (s.speculative == false || job.options.constraint || job.options.processors.any()) return;
  const bool drafter = ctx.engine->draft_model() || ctx.engine->dflash();
  if (!drafter && ctx.options.prompt_lookup == 0) return;
  job.options.draft_model = ctx.engine->draft_model();
  job.options.dflash = ctx.engine->dflash();
  job.options.prompt_lookup = drafter ? 0 : ctx.options.prompt_lookup;
  job.options.num_draft_tokens = s.num_draft_tokens.value_or(ctx.options.num_draft_tokens);
}

namespace {

// tool_choice required / a named function: a constraint that makes the output tool calls in the
// template's format (Hermes and Llama 3's bare JSON object; the others' markers are special
// tokens the constraint cannot write, or not JSON).
std::shared_ptr<TokenConstraint> forced_tool_calls(const Context& ctx, const ChatRequest& r,
                                                   const std::string& prefix) {
  constrain::ToolCallSyntax syntax;
  if (ctx.tool_format == ToolFormat::kHermes) {
    syntax = {"<tool_call>\n", "\n</tool_call>", "\n", "arguments"};
  } else if (ctx.tool_format == ToolFormat::kLlama3) {
    syntax = {"", "", "", "parameters"};
  } else {
    bad_field("tool_choice", r.tool_choice +
                                 " is supported for the hermes and llama3 tool-call formats; "
                                 "this chat template's is " +
                                 tool_format_name(ctx.tool_format));
  }
  if (r.s.json_object || r.s.json_schema)
    bad_field("response_format", "cannot be combined with tool_choice " + r.tool_choice);
  std::vector<std::pair<std::string, constrain::Grammar>> tools;
  for (size_t i = 0; i < r.tools->size(); ++i) {
    const ojson& f = (*r.tools)[i]["function"];
    const std::string name = f["name"].get<std::string>();
    if (r.tool_choice == "function" && name != r.tool_name) continue;
    const std::string at = "tools[" + std::to_string(i) + "].function.parameters";
    try {
      tools.emplace_back(name, f.contains("parameters") && !f["parameters"].is_null()
                                   ? constrain::compile_schema(json::parse(f["parameters"].dump()))
                                   : constrain::any_json_grammar(/*object_only=*/true));
    } catch (const lmx::Error& e) {
      bad_field(at, e.what());
    }
  }
  return std::make_shared<constrain::JsonConstraint>(
      ctx.engine->token_table(),
      constrain::after_text(
          prefix, constrain::tool_call_grammar(
                      tools, syntax, r.tool_choice == "required" && r.parallel_tool_calls)),
      ctx.engine->eos_ids());
}

}  // namespace

PreparedChat prepare_chat(const Context& ctx, const ChatRequest& r) {
  check_model(ctx, r.s.model);
  if (!ctx.chat_template)
    throw ApiError(400,
                   "the model has no chat template (" + ctx.template_error +
                       "); pass --chat-template or use /v1/completions",
                   "messages");
  chat::TemplateOptions topt;
  topt.add_generation_prompt = r.messages.back().value("role", "") != "assistant";
  const bool use_tools = r.tools && r.tool_choice != "none";
  if (use_tools) topt.tools = *r.tools;
  topt.kwargs = ctx.template_args;
  for (const auto& [k, v] : r.template_kwargs.items()) topt.kwargs[k] = v;
  std::string text;
  try {
    text = ctx.chat_template->render(r.messages, topt);
  } catch (const std::exception& e) {
    throw ApiError(400, std::string("the chat template failed: ") + e.what(), "messages");
  }
  PreparedChat p;
  const size_t open = text.rfind("<think>"), close = text.rfind("</think>");
  p.pipeline.start_in_reasoning =
      open != std::string::npos && (close == std::string::npos || close < open);
  // A constrained answer skips the open reasoning block: the constraint closes it first.
  const std::string prefix = p.pipeline.start_in_reasoning ? "</think>\n\n" : "";
  p.job = make_job(ctx, ctx.engine->tokenizer().encode(text, /*add_special_tokens=*/false), r.s,
                   "messages", prefix);
  if (use_tools && (r.tool_choice == "required" || r.tool_choice == "function")) {
    p.job->options.constraint = forced_tool_calls(ctx, r, prefix);
    speculate(ctx, r.s, *p.job);
  }
  p.pipeline.stop = r.s.stop;
  p.pipeline.tool_format = ctx.tool_format;
  p.pipeline.parse_tools = use_tools;
  if (use_tools) p.pipeline.tools = *r.tools;
  p.pipeline.split_reasoning = true;
  return p;
}

namespace {

int port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

// The numeric host, as cpp-httplib writes Request::remote_addr.
std::string host_of(const sockaddr_storage& a, socklen_t len) {
  char host[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof host, nullptr, 0,
                  NI_NUMERICHOST) != 0)
    return "";
  return host;
}

// The first socket of this process for which match(fd, local, peer, peer_len) holds (peer
// zeroed for a socket without one), or -1.
template <class Match>
int find_socket(const Match& match) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end) continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof local, peer_len = sizeof peer;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0)
      continue;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0)
      peer_len = 0;
    if (match(static_cast<int>(fd), local, peer, peer_len)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

int connection_socket(const httplib::Request& req) {
  return find_socket(
      [&](int, const sockaddr_storage& local, const sockaddr_storage& peer, socklen_t peer_len) {
        return peer_len > 0 && port_of(local) == req.local_port &&
               port_of(peer) == req.remote_port && host_of(peer, peer_len) == req.remote_addr;
      });
}

// Debian's cpp-httplib is a shared library built with a listen backlog of 5: a burst of new
// connections from many clients then overflows the accept queue while the accept thread waits
// for the CPU, and the kernel drops them (the soak saw 2 connection resets in 128,000 requests
// from 64 clients, and the kernel had counted ListenOverflows). listen() again on the bound
// socket raises its backlog.
void widen_backlog(int port) {
  const int fd = find_socket(
      [&](int fd, const sockaddr_storage& local, const sockaddr_storage&, socklen_t peer_len) {
        int listening = 0;
        socklen_t len = sizeof listening;
        return peer_len == 0 && port_of(local) == port &&
               getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening;
      });
  if (fd >= 0) ::listen(fd, SOMAXCONN);
}

bool peer_closed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  // Readable: either a pipelined request (data) or the end of the stream (0 bytes).
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace

std::function<bool()> client_connected(const httplib::Request& req) {
  const int fd = connection_socket(req);
  if (fd < 0) return [] { return true; };
  // The worker thread that owns the socket is the one waiting in this handler: it stays open.
  return [fd] { return !peer_closed(fd); };
}

std::string new_id(const std::string& prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%012llx",
                static_cast<unsigned long long>((salt ^ (counter++ * 0x9E3779B97F4A7C15ull)) &
                                                0xffffffffffffull));
  return prefix + buf;
}

std::string token_text(const Context& ctx, int id) { return ctx.engine->tokenizer().decode({id}); }

bool write_sse(httplib::DataSink& sink, const ojson& data, const std::string& event) {
  std::string s;
  if (!event.empty()) s += "event: " + event + "\n";
  s += "data: " + data.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
  return sink.write(s.data(), s.size());
}

void write_stream_error(httplib::DataSink& sink, const ApiError& e) {
  write_sse(sink, {{"error", {{"message", e.what()}, {"type", e.type}}}});
  sink.done();
}

void send_json(httplib::Response& res, const ojson& body) {
  res.set_content(body.dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
}

namespace {

ojson error_body(const ApiError& e) {
  ojson err = {{"message", e.what()}, {"type", e.type}};
  err["param"] = e.param.empty() ? ojson(nullptr) : ojson(e.param);
  err["code"] = e.code.empty() ? ojson(nullptr) : ojson(e.code);
  return {{"error", err}};
}

void send_error(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429) res.set_header("Retry-After", "1");  // the queue drains step by step
  ojson body = error_body(e);
  if (req.path.rfind("/v1/messages", 0) == 0) {
    // Anthropic's shape: {"type": "error", "error": {"type", "message"}}.
    const std::string type = e.status == 401   ? "authentication_error"
                             : e.status == 404 ? "not_found_error"
                             : e.status == 408 ? "timeout_error"
                             : e.status == 413 ? "request_too_large"
                             : e.status == 429 ? "rate_limit_error"
                             : e.status >= 500 ? "api_error"
                                               : "invalid_request_error";
    body = {{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}};
  }
  send_json(res, body);
}

void log(const Context& ctx, const char* level, const std::string& msg) {
  if (ctx.options.log_level == "ERROR" || ctx.options.log_level == "CRITICAL") return;
  if (ctx.options.log_level == "WARNING" && std::string(level) == "INFO") return;
  std::fprintf(stderr, "lmx serve: %s: %s\n", level, msg.c_str());
}

// The `model` a JSON request body names ("" when it names none or is not JSON: the default model;
// the handler then reports the body's own errors).
std::string model_of(const httplib::Request& req) {
  if (req.body.empty()) return "";
  const ojson body = ojson::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_object() && body.contains("model") && body["model"].is_string())
    return body["model"].get<std::string>();
  return "";
}

// Wraps a handler: picks the model the request names (loading it when needed), holds it until
// the response is done (a streamed body is written after the handler returns), and answers
// OpenAI-shaped errors for ApiError and anything thrown.
httplib::Server::Handler guarded(Models& models, void (*fn)(const Context&, const httplib::Request&,
                                                            httplib::Response&)) {
  return [&models, fn](const httplib::Request& req, httplib::Response& res) {
    std::shared_ptr<Context> ctx;
    try {
      ctx = models.get(model_of(req));
      fn(*ctx, req, res);
      if (res.content_provider_) {
        res.content_provider_resource_releaser_ =
            [ctx, release = std::move(res.content_provider_resource_releaser_)](bool ok) {
              if (release) release(ok);
            };
      }
    } catch (const ApiError& e) {
      send_error(req, res, e);
    } catch (const std::exception& e) {
      if (ctx) log(*ctx, "ERROR", req.path + ": " + e.what());
      send_error(req, res, ApiError(500, e.what(), "", "server_error"));
    }
  };
}

// One served model: its engine (loaded here), chat template and tool format.
std::shared_ptr<Context> make_context(const ServerOptions& o, const ModelSpec& spec, bool first,
                                      const ojson& template_args, long created,
                                      const std::shared_ptr<TurnLock>& turns, Metrics* metrics,
                                      const std::shared_ptr<ResponseStore>& responses) {
  auto ctx = std::make_shared<Context>();
  ctx->responses = responses;
  ctx->options = o;
  ctx->options.model = spec.path;
  ctx->created = created;
  ctx->model_id = spec.id;
  ctx->aliases = spec.aliases;
  ctx->any_name = first && o.any_model_name;
  ctx->template_args = template_args;
  EngineOptions eo;
  eo.model = spec.path;
  eo.exact = o.exact;
  if (first) {
    eo.adapter_path = o.adapter_path;
    eo.adapters = o.adapters;
    eo.draft_model = o.draft_model;
  } else {
    ctx->options.adapter_path.reset();
    ctx->options.adapters.clear();
    ctx->options.draft_model.reset();
  }
  eo.scheduler = o.scheduler;
  eo.scheduler.prompt_cache_entries = o.prompt_cache_entries;
  eo.scheduler.prompt_cache_bytes = o.prompt_cache_bytes;
  eo.scheduler.turns = turns;
  eo.log_stats = o.log_level == "INFO" || o.log_level == "DEBUG";
  eo.metrics = metrics;
  eo.name = spec.id;
  {
    // Loading runs MLX work: it takes a turn among the running models' schedulers.
    std::lock_guard<TurnLock> turn(*turns);
    ctx->engine = std::make_unique<Engine>(eo);
    if (!o.kv_config.empty())
      ctx->kv_config = o.kv_config == "off" ? std::vector<KVLayerBits>{}
                                            : ctx->engine->model().read_kv_config(o.kv_config);
  }
  try {
    ctx->chat_template = chat::load_chat_template(spec.path, o.chat_template);
  } catch (const lmx::Error& e) {
    if (!o.chat_template.empty()) throw;
    ctx->template_error = e.what();
  }
  const std::string source = o.chat_template.empty()
                                 ? ctx->engine->tokenizer().chat_template()
                                 : chat::read_chat_template_arg(o.chat_template);
  ctx->tool_format = detect_tool_format(source);
  ctx->engine->start();
  log(*ctx, "INFO",
      "loaded " + spec.id + " (tier " + ctx->engine->model().tier() + ", tool format " +
          tool_format_name(ctx->tool_format) + ")");
  return ctx;
}

std::vector<ModelSpec> model_specs(const ServerOptions& o) {
  std::vector<ModelSpec> specs;
  auto add = [&](const std::string& id, const std::filesystem::path& path) {
    for (const auto& s : specs)
      check(s.id != id, "serve", "the model name '", id, "' is given twice, expected one");
    ModelSpec s;
    s.id = id;
    s.path = path;
    s.weight_bytes = weight_bytes(path);
    // A short name: the last part of a repo id or directory ("org/name" -> "name").
    const std::string base = std::filesystem::path(id).filename().string();
    if (!base.empty() && base != id) s.aliases.push_back(base);
    specs.push_back(std::move(s));
  };
  if (!o.model.empty()) add(o.model_id.empty() ? o.model.string() : o.model_id, o.model);
  for (const auto& [id, path] : o.more_models) add(id, path);
  if (o.models_dir)
    for (auto& s : scan_models_dir(*o.models_dir))
      if (std::none_of(specs.begin(), specs.end(), [&](const auto& x) { return x.id == s.id; }))
        specs.push_back(std::move(s));
  check(!specs.empty(), "serve", "no model to serve: --models-dir '",
        o.models_dir ? o.models_dir->string() : "", "' holds no model directory (config.json)");
  for (const std::string& n : o.served_model_names) specs[0].aliases.push_back(n);
  return specs;
}

}  // namespace

int serve(const ServerOptions& o) {
  // SIGINT / SIGTERM go to one waiting thread only (blocked here, before any thread starts).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ojson template_args = ojson::parse(o.chat_template_args, nullptr, false);
  check(!template_args.is_discarded() && template_args.is_object(), "serve",
        "--chat-template-args must be a JSON object, got ", o.chat_template_args);
  const long created = static_cast<long>(std::time(nullptr));
  Metrics metrics;
  auto turns = std::make_shared<TurnLock>();
  auto responses = std::make_shared<ResponseStore>(std::chrono::seconds(o.responses_ttl_seconds),
                                                   o.responses_max_bytes);
  std::vector<ModelSpec> specs = model_specs(o);
  const std::string first_id = specs[0].id;
  ModelsOptions mo;
  mo.max_loaded = o.max_loaded_models > 0 ? o.max_loaded_models
                                          : std::max(1, static_cast<int>(1 + o.more_models.size()));
  mo.memory_budget = o.memory_budget;
  mo.any_name = o.any_model_name;
  Models models(
      std::move(specs), mo,
      [&](const ModelSpec& spec) {
        return make_context(o, spec, spec.id == first_id, template_args, created, turns, &metrics,
                            responses);
      },
      &metrics);
  // The server-wide options and logging; no model (holding one would keep it from unloading).
  Context server;
  server.options = o;
  const Context& ctx = server;

  httplib::Server http;
  const int threads = o.http_threads;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(o.max_body_bytes);
  http.set_pre_routing_handler([&ctx](const httplib::Request& req, httplib::Response& res) {
    if (ctx.options.api_key.empty() || req.path == "/health" || is_chat_page(req.path))
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string_view bearer = std::string_view(auth).starts_with("Bearer ")
                                        ? std::string_view(auth).substr(7)
                                        : std::string_view();
    const std::string xkey = req.get_header_value("x-api-key");
    // Both compared, always: which header carried the key is not timed either.
    const bool by_bearer = same_secret(bearer, ctx.options.api_key);
    const bool by_xkey = same_secret(xkey, ctx.options.api_key);
    if (by_bearer || by_xkey) return httplib::Server::HandlerResponse::Unhandled;
    send_error(req, res,
               ApiError(401, "Incorrect API key provided", "", "invalid_request_error",
                        "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404)
      send_error(req, res, ApiError(404, "Unknown route " + req.method + " " + req.path));
    else if (res.status == 413)
      send_error(req, res, ApiError(413, "The request body is larger than the server's limit"));
    else
      send_error(req, res, ApiError(res.status, "HTTP error " + std::to_string(res.status)));
  });
  http.set_logger([&ctx, &metrics](const httplib::Request& req, const httplib::Response& res) {
    metrics.request(req.method, Metrics::route_of(req.path), res.status);
    log(ctx, "INFO", req.method + " " + req.path + " " + std::to_string(res.status));
  });
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  add_chat_page(http);
  const auto model_card = [created](const ModelSpec& s, bool loaded) {
    return ojson{{"id", s.id},
                 {"object", "model"},
                 {"created", created},
                 {"owned_by", "lmx"},
                 {"loaded", loaded}};
  };
  // Loaded adapters are models too (as vLLM lists its LoRA adapters), with the base as parent.
  const auto adapter_card = [created](const std::string& name, const std::string& parent) {
    return ojson{{"id", name},
                 {"object", "model"},
                 {"created", created},
                 {"owned_by", "lmx"},
                 {"parent", parent}};
  };
  http.Get("/v1/models",
           [&models, model_card, adapter_card](const httplib::Request&, httplib::Response& res) {
             ojson data = ojson::array();
             for (const auto& s : models.specs()) {
               auto loaded = models.loaded(s.id);
               data.push_back(model_card(s, loaded != nullptr));
               if (loaded)
                 for (const auto& a : loaded->engine->adapters())
                   data.push_back(adapter_card(a.name, s.id));
             }
             send_json(res, {{"object", "list"}, {"data", data}});
           });
  http.Get(R"(/v1/models/(.+))", [&models, model_card, adapter_card](const httplib::Request& req,
                                                                     httplib::Response& res) {
    const std::string id = req.matches[1];
    const ModelSpec* s = models.spec(id);
    auto loaded = s ? models.loaded(s->id) : nullptr;
    if (!s) {
      send_error(req, res,
                 ApiError(404, "The model '" + id + "' does not exist", "model",
                          "invalid_request_error", "model_not_found"));
      return;
    }
    if (loaded && loaded->engine->has_adapter(id) && id != s->id)
      send_json(res, adapter_card(id, s->id));
    else
      send_json(res, model_card(*s, loaded != nullptr));
  });
  const auto gauges = [&models] {
    std::vector<ModelGauges> g;
    for (const auto& c : models.loaded()) g.push_back({c->model_id, c->engine->stats()});
    return g;
  };
  http.Get("/metrics", [&metrics, gauges](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.prometheus(gauges()), "text/plain; version=0.0.4; charset=utf-8");
  });
  http.Get("/stats", [&metrics, gauges](const httplib::Request&, httplib::Response& res) {
    send_json(res, metrics.json(gauges()));
  });
  http.Get("/v1/adapters", guarded(models, handle_list_adapters));
  http.Post("/v1/adapters", guarded(models, handle_load_adapter));
  http.Delete(R"(/v1/adapters/(.+))", guarded(models, handle_unload_adapter));
  http.Post("/v1/load_lora_adapter", guarded(models, handle_load_adapter));
  http.Post("/v1/unload_lora_adapter", guarded(models, handle_unload_adapter));
  http.Post("/v1/chat/completions", guarded(models, handle_chat));
  http.Post("/chat/completions", guarded(models, handle_chat));
  http.Post("/v1/completions", guarded(models, handle_completion));
  http.Post("/v1/messages", guarded(models, handle_messages));
  http.Post("/v1/messages/count_tokens", guarded(models, handle_count_tokens));
  http.Post("/v1/embeddings", guarded(models, handle_embeddings));
  http.Post("/embeddings", guarded(models, handle_embeddings));
  http.Post("/v1/responses", guarded(models, handle_responses));
  http.Get(R"(/v1/responses/([^/]+))", guarded(models, handle_get_response));
  http.Delete(R"(/v1/responses/([^/]+))", guarded(models, handle_delete_response));

  check(http.bind_to_port(o.host, o.port), "serve", "cannot listen on ", o.host, ":", o.port);
  widen_backlog(o.port);
  std::string names;
  for (const auto& sp : models.specs()) names += (names.empty() ? "" : ", ") + sp.id;
  log(ctx, "INFO", "serving " + names + " on http://" + o.host + ":" + std::to_string(o.port));

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    log(ctx, "INFO", std::string("shutting down on ") + (sig == SIGINT ? "SIGINT" : "SIGTERM"));
    http.stop();
  });
  http.listen_after_bind();
  // listen_after_bind returns once stop() ran: every worker has finished its response.
  models.stop();
  if (waiter.joinable()) {
    pthread_kill(waiter.native_handle(), SIGTERM);
    waiter.join();
  }
  return 0;
}

}  // namespace lmx::server
