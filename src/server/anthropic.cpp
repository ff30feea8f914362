// POST /v1/messages: Anthropic's Messages API. The stream is message_start, then per content
// block content_block_start / content_block_delta... / content_block_stop, then message_delta
// (stop_reason, usage) and message_stop.
#include "server/api_error.h"
#include "server/context.h"

namespace lmx::server {

namespace {

std::string stop_reason(const RunSummary& s) {
  if (s.finish_reason == "tool_calls") return "tool_use";
  if (s.finish_reason == "length") return "max_tokens";
  if (s.stopped_by_string) return "stop_sequence";
  return "end_turn";
}

ojson tool_input(const ToolCall& c) {
  ojson j = ojson::parse(c.arguments, nullptr, false);
  return j.is_discarded() ? ojson::object() : j;
}

ojson tool_use_block(const ToolCall& c, bool empty_input) {
  return {{"type", "tool_use"},
          {"id", c.id.empty() ? new_id("toolu_") : c.id},
          {"name", c.name},
          {"input", empty_input ? ojson::object() : tool_input(c)}};
}

ojson usage(const RunSummary& s, size_t prompt_tokens) {
  return {{"input_tokens", prompt_tokens - s.result.cached_tokens},
          {"output_tokens", s.completion_tokens},
          {"cache_read_input_tokens", s.result.cached_tokens},
          {"cache_creation_input_tokens", 0}};
}

// Streams blocks in order, opening a new one whenever the kind changes.
class BlockWriter {
 public:
  explicit BlockWriter(httplib::DataSink& sink) : sink_(sink) {}
  bool text(const std::string& kind, const std::string& piece) {
    if (piece.empty()) return true;
    if (open_ != kind && !start(kind)) return false;
    const bool thinking = kind == "thinking";
    return write("content_block_delta", {{"type", "content_block_delta"},
                                         {"index", index_},
                                         {"delta",
                                          {{"type", thinking ? "thinking_delta" : "text_delta"},
                                           {thinking ? "thinking" : "text", piece}}}});
  }
  bool tool(const ToolCall& c) {
    if (!close()) return false;
    open_ = "tool_use";
    return write("content_block_start", {{"type", "content_block_start"},
                                         {"index", index_},
                                         {"content_block", tool_use_block(c, true)}}) &&
           write("content_block_delta",
                 {{"type", "content_block_delta"},
                  {"index", index_},
                  {"delta", {{"type", "input_json_delta"}, {"partial_json", c.arguments}}}}) &&
           close();
  }
  bool close() {
    if (open_.empty()) return true;
    if (open_ == "thinking" &&
        !write("content_block_delta",
               {{"type", "content_block_delta"},
                {"index", index_},
                {"delta", {{"type", "signature_delta"}, {"signature", ""}}}}))
      return false;
    open_.clear();
    return write("content_block_stop", {{"type", "content_block_stop"}, {"index", index_++}});
  }
  bool write(const std::string& event, const ojson& data) { return write_sse(sink_, data, event); }

 private:
  bool start(const std::string& kind) {
    if (!close()) return false;
    open_ = kind;
    ojson block = kind == "thinking"
                      ? ojson{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                      : ojson{{"type", "text"}, {"text", ""}};
    return write("content_block_start",
                 {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
  }
  httplib::DataSink& sink_;
  std::string open_;
  int index_ = 0;
};

}  // namespace

void handle_messages(const Context& ctx, const httplib::Request& req, httplib::Response& res) {
  const ChatRequest r = parse_anthropic_request(parse_body(req.body), ctx.options.defaults);
  PreparedChat p = prepare_chat(ctx, r);
  const size_t n_prompt = p.job->prompt.size();
  const std::string id = new_id("msg_");
  if (!r.s.stream) {
    OutputPipeline pipeline(p.pipeline);
    ojson content = ojson::array();
    auto append = [&](const std::string& type, const std::string& piece) {
      if (piece.empty()) return;
      if (content.empty() || content.back()["type"] != type)
        content.push_back(type == "thinking"
                              ? ojson{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                              : ojson{{"type", "text"}, {"text", ""}});
      auto& field = content.back()[type == "thinking" ? "thinking" : "text"];
      field = field.get<std::string>() + piece;
    };
    const auto connected = client_connected(req);
    RunSummary s = run_job(*ctx.engine, p.job, pipeline, connected, [&](const Delta& d) {
      append("thinking", d.reasoning);
      append("text", d.content);
      for (const auto& c : d.tool_calls) content.push_back(tool_use_block(c, false));
      return connected();
    });
    ojson body = {{"id", id},
                  {"type", "message"},
                  {"role", "assistant"},
                  {"model", ctx.model_id},
                  {"content", content},
                  {"stop_reason", stop_reason(s)}};
    body["stop_sequence"] = nullptr;
    body["usage"] = usage(s, n_prompt);
    send_json(res, body);
    return;
  }
  auto job = p.job;
  auto popts = p.pipeline;
  res.set_header("Cache-Control", "no-cache");
  ctx.engine->submit(job);  // before the headers: a full queue is a 429
  res.set_chunked_content_provider(
      "text/event-stream",
      [&ctx, job, popts, id, n_prompt, connected = client_connected(req)](size_t,
                                                                      httplib::DataSink& sink) {
        OutputPipeline pipeline(popts);
        BlockWriter w(sink);
        ojson start = {{"id", id},
                       {"type", "message"},
                       {"role", "assistant"},
                       {"model", ctx.model_id},
                       {"content", ojson::array()},
                       {"stop_reason", nullptr},
                       {"stop_sequence", nullptr},
                       {"usage", {{"input_tokens", n_prompt}, {"output_tokens", 0}}}};
        if (!w.write("message_start", {{"type", "message_start"}, {"message", start}}))
          return false;
        RunSummary s;
        try {
          s = run_job(*ctx.engine, job, pipeline, connected, [&](const Delta& d) {
            bool ok = w.text("thinking", d.reasoning) && w.text("text", d.content);
            for (const auto& c : d.tool_calls) ok = ok && w.tool(c);
            return ok && sink.is_writable();
          });
        } catch (const ApiError& e) {
          w.write("error",
                  {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", e.what()}}}});
          sink.done();
          return true;
        }
        if (s.finish_reason == "cancelled") return false;
        w.close();
        ojson delta = {{"type", "message_delta"},
                       {"delta", {{"stop_reason", stop_reason(s)}, {"stop_sequence", nullptr}}},
                       {"usage", usage(s, n_prompt)}};
        w.write("message_delta", delta);
        w.write("message_stop", {{"type", "message_stop"}});
        sink.done();
        return true;
      },
      [&ctx, job](bool) { ctx.engine->cancel(*job); });
}

// POST /v1/messages/count_tokens: the prompt the request would run, counted (max_tokens is not
// part of this request).
void handle_count_tokens(const Context& ctx, const httplib::Request& req, httplib::Response& res) {
  ojson body = parse_body(req.body);
  if (!body.contains("max_tokens")) body["max_tokens"] = 0;
  const ChatRequest r = parse_anthropic_request(body, ctx.options.defaults);
  const PreparedChat p = prepare_chat(ctx, r);
  send_json(res, {{"input_tokens", p.job->prompt.size()}});
}

}  // namespace lmx::server
