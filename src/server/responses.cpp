#include "server/responses.h"

#include <ctime>

#include "server/api_error.h"
#include "server/context.h"

namespace lmx::server {

namespace {

struct Output {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  int reasoning_tokens = 0;
};

ojson message_item(const std::string& id, const std::string& text, const char* status) {
  return {
      {"type", "message"},
      {"id", id},
      {"status", status},
      {"role", "assistant"},
      {"content",
       ojson::array({{{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}}})}};
}

ojson reasoning_item(const std::string& id, const std::string& text) {
  return {{"type", "reasoning"},
          {"id", id},
          {"summary", ojson::array()},
          {"content", ojson::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}

ojson call_item(const std::string& id, const ToolCall& c, const std::string& call_id,
                const char* status) {
  return {{"type", "function_call"},  {"id", id},        {"call_id", call_id}, {"name", c.name},
          {"arguments", c.arguments}, {"status", status}};
}

// The response object: `output` and `usage` filled at the end.
ojson response_base(const Context& ctx, const std::string& id, const ojson& body, long created,
                    const char* status) {
  ojson r = {
      {"id", id},
      {"object", "response"},
      {"created_at", created},
      {"status", status},
      {"error", nullptr},
      {"incomplete_details", nullptr},
      {"instructions", body.contains("instructions") ? body["instructions"] : ojson(nullptr)},
      {"max_output_tokens",
       body.contains("max_output_tokens") ? body["max_output_tokens"] : ojson(nullptr)},
      {"model", ctx.model_id},
      {"output", ojson::array()},
      {"parallel_tool_calls", body.value("parallel_tool_calls", true)},
      {"previous_response_id",
       body.contains("previous_response_id") ? body["previous_response_id"] : ojson(nullptr)},
      {"store", body.value("store", true)},
      {"temperature", body.contains("temperature") ? body["temperature"] : ojson(nullptr)},
      {"text", body.contains("text") ? body["text"] : ojson{{"format", {{"type", "text"}}}}},
      {"tool_choice", body.contains("tool_choice") ? body["tool_choice"] : ojson("auto")},
      {"tools", body.contains("tools") ? body["tools"] : ojson::array()},
      {"top_p", body.contains("top_p") ? body["top_p"] : ojson(nullptr)},
      {"truncation", "disabled"},
      {"usage", nullptr},
      {"metadata", body.contains("metadata") ? body["metadata"] : ojson::object()}};
  return r;
}

void finish_response(ojson& r, const RunSummary& s, size_t n_prompt, int reasoning_tokens) {
  const bool incomplete = s.finish_reason == "length";
  r["status"] = incomplete ? "incomplete" : "completed";
  if (incomplete) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  r["usage"] = {{"input_tokens", n_prompt},
                {"input_tokens_details", {{"cached_tokens", s.result.cached_tokens}}},
                {"output_tokens", s.completion_tokens},
                {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
                {"total_tokens", n_prompt + s.completion_tokens}};
}

// Stores the conversation with this response's turn, for previous_response_id.
void store_response(const Context& ctx, const ojson& body, const ojson& chat, const ojson& r,
                    const Output& out) {
  if (!body.value("store", true)) return;
  ojson messages = chat["messages"];
  ojson turn = {{"role", "assistant"}, {"content", out.content}};
  if (!out.calls.empty()) {
    ojson calls = ojson::array();
    for (const auto& item : r["output"])
      if (item["type"] == "function_call")
        calls.push_back({{"id", item["call_id"]},
                         {"type", "function"},
                         {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
    turn["tool_calls"] = calls;
  }
  messages.push_back(turn);
  ctx.responses->put(r["id"].get<std::string>(), {r, messages});
}

}  // namespace

void handle_responses(const Context& ctx, const httplib::Request& req, httplib::Response& res) {
  const ojson body = parse_body(req.body);
  const ojson chat = responses_to_chat(body, *ctx.responses);
  const ChatRequest r = parse_chat_request(chat, ctx.options.defaults);
  PreparedChat p = prepare_chat(ctx, r);
  const size_t n_prompt = p.job->prompt.size();
  const std::string id = new_id("resp_");
  const long created = static_cast<long>(std::time(nullptr));
  if (!r.s.stream) {
    OutputPipeline pipeline(p.pipeline);
    Output out;
    const auto connected = client_connected(req);
    RunSummary s = run_job(*ctx.engine, p.job, pipeline, connected, [&](const Delta& d) {
      out.content += d.content;
      out.reasoning += d.reasoning;
      if (!d.reasoning.empty()) out.reasoning_tokens += static_cast<int>(d.tokens.size());
      out.calls.insert(out.calls.end(), d.tool_calls.begin(), d.tool_calls.end());
      return connected();
    });
    ojson resp = response_base(ctx, id, body, created, "completed");
    if (!out.reasoning.empty())
      resp["output"].push_back(reasoning_item(new_id("rs_"), out.reasoning));
    if (!out.content.empty() || out.calls.empty())
      resp["output"].push_back(message_item(new_id("msg_"), out.content, "completed"));
    for (const auto& c : out.calls)
      resp["output"].push_back(
          call_item(new_id("fc_"), c, c.id.empty() ? new_id("call_") : c.id, "completed"));
    finish_response(resp, s, n_prompt, out.reasoning_tokens);
    store_response(ctx, body, chat, resp, out);
    send_json(res, resp);
    return;
  }
  auto job = p.job;
  auto popts = p.pipeline;
  res.set_header("Cache-Control", "no-cache");
  ctx.engine->submit(job);  // before the headers: a full queue is a 429
  res.set_chunked_content_provider(
      "text/event-stream",
      [&ctx, job, popts, id, body, chat, created, n_prompt, connected = client_connected(req)](
          size_t, httplib::DataSink& sink) {
        OutputPipeline pipeline(popts);
        int seq = 0;
        auto event = [&](const std::string& type, ojson data) {
          ojson e = {{"type", type}, {"sequence_number", seq++}};
          for (auto& [k, v] : data.items()) e[k] = v;
          return write_sse(sink, e, type);
        };
        ojson resp = response_base(ctx, id, body, created, "in_progress");
        if (!event("response.created", {{"response", resp}}) ||
            !event("response.in_progress", {{"response", resp}})) {
          ctx.engine->cancel(*job);
          return false;
        }
        Output out;
        // The item being streamed: "" none, "reasoning" or "message".
        std::string open;
        std::string item_id;
        int index = -1;
        auto close = [&]() {
          bool ok = true;
          if (open == "message") {
            ok = event("response.output_text.done", {{"item_id", item_id},
                                                     {"output_index", index},
                                                     {"content_index", 0},
                                                     {"text", out.content}}) &&
                 event("response.content_part.done", {{"item_id", item_id},
                                                      {"output_index", index},
                                                      {"content_index", 0},
                                                      {"part",
                                                       {{"type", "output_text"},
                                                        {"text", out.content},
                                                        {"annotations", ojson::array()}}}});
            ojson item = message_item(item_id, out.content, "completed");
            resp["output"].push_back(item);
            ok =
                ok && event("response.output_item.done", {{"output_index", index}, {"item", item}});
          } else if (open == "reasoning") {
            ok = event("response.reasoning_text.done", {{"item_id", item_id},
                                                        {"output_index", index},
                                                        {"content_index", 0},
                                                        {"text", out.reasoning}});
            ojson item = reasoning_item(item_id, out.reasoning);
            resp["output"].push_back(item);
            ok =
                ok && event("response.output_item.done", {{"output_index", index}, {"item", item}});
          }
          open.clear();
          return ok;
        };
        auto begin = [&](const std::string& kind) {
          if (open == kind) return true;
          if (!close()) return false;
          open = kind;
          index = static_cast<int>(resp["output"].size());
          if (kind == "message") {
            item_id = new_id("msg_");
            ojson item = message_item(item_id, "", "in_progress");
            item["content"] = ojson::array();
            return event("response.output_item.added", {{"output_index", index}, {"item", item}}) &&
                   event("response.content_part.added", {{"item_id", item_id},
                                                         {"output_index", index},
                                                         {"content_index", 0},
                                                         {"part",
                                                          {{"type", "output_text"},
                                                           {"text", ""},
                                                           {"annotations", ojson::array()}}}});
          }
          item_id = new_id("rs_");
          ojson item = reasoning_item(item_id, "");
          item["content"] = ojson::array();
          return event("response.output_item.added", {{"output_index", index}, {"item", item}});
        };
        RunSummary s;
        try {
          s = run_job(*ctx.engine, job, pipeline, connected, [&](const Delta& d) {
            bool ok = true;
            if (!d.reasoning.empty()) {
              out.reasoning += d.reasoning;
              out.reasoning_tokens += static_cast<int>(d.tokens.size());
              ok = begin("reasoning") &&
                   event("response.reasoning_text.delta", {{"item_id", item_id},
                                                           {"output_index", index},
                                                           {"content_index", 0},
                                                           {"delta", d.reasoning}});
            }
            if (ok && !d.content.empty()) {
              out.content += d.content;
              ok = begin("message") &&
                   event("response.output_text.delta", {{"item_id", item_id},
                                                        {"output_index", index},
                                                        {"content_index", 0},
                                                        {"delta", d.content},
                                                        {"logprobs", ojson::array()}});
            }
            for (const auto& c : d.tool_calls) {
              if (!ok) break;
              ok = close();
              out.calls.push_back(c);
              const int at = static_cast<int>(resp["output"].size());
              const std::string fid = new_id("fc_");
              const std::string call_id = c.id.empty() ? new_id("call_") : c.id;
              ojson added = call_item(fid, c, call_id, "in_progress");
              added["arguments"] = "";
              ojson done = call_item(fid, c, call_id, "completed");
              resp["output"].push_back(done);
              ok = ok &&
                   event("response.output_item.added", {{"output_index", at}, {"item", added}}) &&
                   event("response.function_call_arguments.delta",
                         {{"item_id", fid}, {"output_index", at}, {"delta", c.arguments}}) &&
                   event("response.function_call_arguments.done",
                         {{"item_id", fid}, {"output_index", at}, {"arguments", c.arguments}}) &&
                   event("response.output_item.done", {{"output_index", at}, {"item", done}});
            }
            return ok && sink.is_writable();
          });
        } catch (const ApiError& e) {
          event("error", {{"code", e.code.empty() ? ojson(nullptr) : ojson(e.code)},
                          {"message", e.what()},
                          {"param", nullptr}});
          sink.done();
          return true;
        }
        if (s.finish_reason == "cancelled") return false;
        if (resp["output"].empty() && open.empty() && out.calls.empty()) begin("message");
        close();
        finish_response(resp, s, n_prompt, out.reasoning_tokens);
        store_response(ctx, body, chat, resp, out);
        event(resp["status"] == "incomplete" ? "response.incomplete" : "response.completed",
              {{"response", resp}});
        sink.done();
        return true;
      },
      [&ctx, job](bool) { ctx.engine->cancel(*job); });
}

void handle_get_response(const Context& ctx, const httplib::Request& req, httplib::Response& res) {
  const std::string id = req.matches[1];
  auto e = ctx.responses->get(id);
  if (!e)
    throw ApiError(404, "Response with id '" + id + "' not found.", "response_id",
                   "invalid_request_error", "not_found");
  send_json(res, e->response);
}

void handle_delete_response(const Context& ctx, const httplib::Request& req,
                            httplib::Response& res) {
  const std::string id = req.matches[1];
  if (!ctx.responses->erase(id))
    throw ApiError(404, "Response with id '" + id + "' not found.", "response_id",
                   "invalid_request_error", "not_found");
  send_json(res, {{"id", id}, {"object", "response"}, {"deleted", true}});
}

}  // namespace lmx::server
