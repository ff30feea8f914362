// What every endpoint handler shares: the engine, the template, the defaults, and the helpers
// that turn a typed request into a job.
#pragma once

#include <httplib.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "chat/chat_template.h"
#include "server/api_error.h"
#include "server/engine.h"
#include "server/pipeline.h"
#include "server/requests.h"
#include "server/responses.h"
#include "server/server.h"

namespace lmx::server {

struct Context {
  ServerOptions options;
  std::unique_ptr<Engine> engine;
  std::optional<chat::ChatTemplate> chat_template;  // unset: the model has none
  std::string template_error;                       // why it is unset
  ToolFormat tool_format = ToolFormat::kNone;
  ojson template_args = ojson::object();
  std::string model_id;
  std::vector<std::string> aliases;  // other names of this model (--served-model-name...)
  bool any_name = false;             // --any-model-name
  long created = 0;
  std::optional<std::vector<KVLayerBits>> kv_config;  // --kv-config; unset: the model's own
  std::shared_ptr<ResponseStore> responses;           // /v1/responses, shared by every served model
};

struct PreparedChat {
  std::shared_ptr<Job> job;
  PipelineOptions pipeline;
};

// Renders the template, tokenizes, checks the model name and the context length.
PreparedChat prepare_chat(const Context& ctx, const ChatRequest& r);
// With response_format, the job gets its constraint; `constraint_prefix` is text the output is
// forced to begin with first (closing an open <think>).
std::shared_ptr<Job> make_job(const Context& ctx, std::vector<int> prompt, const SamplingRequest& s,
                              const std::string& prompt_field,
                              const std::string& constraint_prefix = "");
void check_model(const Context& ctx, const std::string& model);
// Turns on the server's speculative decoding for a job that can take it (no opt-out, logits
// processors or constraint); call again after a constraint is added (it then turns it off).
void speculate(const Context& ctx, const SamplingRequest& s, Job& job);
// The adapter a request picks (`adapter`, `model` naming a loaded adapter, or `adapters` as a
// directory, loaded on first use when it lies under --adapter-root); "" for the base model.
// ApiError 404 for an unknown name, 403 for a directory outside the root, 400 for a bad adapter.
std::string resolve_adapter(const Context& ctx, const SamplingRequest& s);

// For non-streaming responses, which write nothing until the end: a check that the client is
// still connected (its socket has not seen the peer's FIN or a reset), polled between tokens.
// cpp-httplib 0.11 does not hand handlers the socket, so it is found among the process's open
// sockets by the request's local and peer address; not found: always true.
std::function<bool()> client_connected(const httplib::Request& req);

std::string new_id(const std::string& prefix);
std::string token_text(const Context& ctx, int id);
bool write_sse(httplib::DataSink& sink, const ojson& data, const std::string& event = "");
// A failure after the stream started: one error event, then the end of the stream.
void write_stream_error(httplib::DataSink& sink, const ApiError& e);
// A JSON body; invalid UTF-8 in generated text is replaced, never an exception.
void send_json(httplib::Response& res, const ojson& body);

void handle_chat(const Context& ctx, const httplib::Request& req, httplib::Response& res);
void handle_completion(const Context& ctx, const httplib::Request& req, httplib::Response& res);
void handle_messages(const Context& ctx, const httplib::Request& req, httplib::Response& res);
void handle_embeddings(const Context& ctx, const httplib::Request& req, httplib::Response& res);
void handle_count_tokens(const Context& ctx, const httplib::Request& req, httplib::Response& res);
// GET /v1/adapters, POST /v1/adapters {id, path}, DELETE /v1/adapters/{id}; vLLM's
// POST /v1/load_lora_adapter {lora_name, lora_path} and /v1/unload_lora_adapter {lora_name}.
void handle_list_adapters(const Context& ctx, const httplib::Request& req, httplib::Response& res);
void handle_load_adapter(const Context& ctx, const httplib::Request& req, httplib::Response& res);
void handle_unload_adapter(const Context& ctx, const httplib::Request& req, httplib::Response& res);
// POST /v1/responses, GET and DELETE /v1/responses/{id} (server/responses.h).
void handle_responses(const Context& ctx, const httplib::Request& req, httplib::Response& res);
void handle_get_response(const Context& ctx, const httplib::Request& req, httplib::Response& res);
void handle_delete_response(const Context& ctx, const httplib::Request& req,
                            httplib::Response& res);

}  // namespace lmx::server
