// POST /v1/chat/completions and /v1/completions: OpenAI's response and SSE chunk shapes (as
// mlx_lm.server writes them, plus OpenAI's logprobs fields).
#include <ctime>

#include "server/api_error.h"
#include "server/context.h"

namespace lmx::server {

namespace {

ojson usage(const RunSummary& s, size_t prompt_tokens) {
  ojson u = {{"prompt_tokens", prompt_tokens},
             {"completion_tokens", s.completion_tokens},
             {"total_tokens", prompt_tokens + s.completion_tokens},
             {"prompt_tokens_details", {{"cached_tokens", s.result.cached_tokens}}}};
  // lmx's own: what speculative decoding did for this request.
  const SpeculativeStats& sp = s.result.stats.speculative;
  if (sp.rounds > 0)
    u["speculative"] = {{"rounds", sp.rounds},
                        {"drafted", sp.drafted},
                        {"accepted", sp.accepted},
                        {"acceptance_rate", sp.acceptance_rate()},
                        {"mean_accepted_length", sp.mean_accepted_length()}};
  return u;
}

ojson bytes_of(const std::string& s) {
  ojson b = ojson::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// OpenAI chat logprobs: {content: [{token, logprob, bytes, top_logprobs: [...]}]}.
ojson chat_logprobs(const Context& ctx, const std::vector<TokenEvent>& tokens) {
  ojson content = ojson::array();
  for (const auto& t : tokens) {
    const std::string text = token_text(ctx, t.token);
    ojson top = ojson::array();
    for (const auto& [id, lp] : t.top) {
      const std::string alt = token_text(ctx, id);
      top.push_back({{"token", alt}, {"logprob", lp}, {"bytes", bytes_of(alt)}, {"id", id}});
    }
    content.push_back({{"token", text},
                       {"logprob", t.logprob},
                       {"bytes", bytes_of(text)},
                       {"id", t.token},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

ojson tool_calls_json(const std::vector<ToolCall>& calls, size_t first_index, bool stream) {
  ojson out = ojson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    ojson c = {{"id", calls[i].id.empty() ? new_id("call_") : calls[i].id},
               {"type", "function"},
               {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (stream) c["index"] = first_index + i;
    out.push_back(c);
  }
  return out;
}

ojson chunk_base(const Context& ctx, const std::string& id, const char* object) {
  return {{"id", id},
          {"object", object},
          {"created", static_cast<long>(std::time(nullptr))},
          {"model", ctx.model_id},
          {"system_fingerprint", "lmx-" + std::string(LMX_VERSION)}};
}

// The end of an OpenAI stream: the usage chunk when asked for, then [DONE].
void finish_stream(const Context& ctx, httplib::DataSink& sink, const std::string& id,
                   const char* object, const RunSummary& s, size_t n_prompt, bool include_usage) {
  if (include_usage) {
    ojson u = chunk_base(ctx, id, object);
    u["choices"] = ojson::array();
    u["usage"] = usage(s, n_prompt);
    write_sse(sink, u);
  }
  const std::string done = "data: [DONE]\n\n";
  sink.write(done.data(), done.size());
  sink.done();
}

}  // namespace

void handle_chat(const Context& ctx, const httplib::Request& req, httplib::Response& res) {
  const ChatRequest r = parse_chat_request(parse_body(req.body), ctx.options.defaults);
  PreparedChat p = prepare_chat(ctx, r);
  const bool want_logprobs = r.s.top_logprobs >= 0;
  const size_t n_prompt = p.job->prompt.size();
  const std::string id = new_id("chatcmpl-");
  if (!r.s.stream) {
    auto pipeline = std::make_shared<OutputPipeline>(p.pipeline);
    std::string content, reasoning;
    std::vector<ToolCall> calls;
    std::vector<TokenEvent> tokens;
    const auto connected = client_connected(req);
    RunSummary s = run_job(*ctx.engine, p.job, *pipeline, connected, [&](const Delta& d) {
      content += d.content;
      reasoning += d.reasoning;
      calls.insert(calls.end(), d.tool_calls.begin(), d.tool_calls.end());
      if (want_logprobs) tokens.insert(tokens.end(), d.tokens.begin(), d.tokens.end());
      return connected();
    });
    ojson msg = {{"role", "assistant"}};
    msg["content"] = content.empty() && !calls.empty() ? ojson(nullptr) : ojson(content);
    if (!reasoning.empty()) msg["reasoning_content"] = msg["reasoning"] = reasoning;
    if (!calls.empty()) msg["tool_calls"] = tool_calls_json(calls, 0, false);
    ojson choice = {{"index", 0}, {"finish_reason", s.finish_reason}, {"message", msg}};
    choice["logprobs"] = want_logprobs ? chat_logprobs(ctx, tokens) : ojson(nullptr);
    ojson body = chunk_base(ctx, id, "chat.completion");
    body["choices"] = ojson::array({choice});
    body["usage"] = usage(s, n_prompt);
    send_json(res, body);
    return;
  }
  auto job = p.job;
  auto popts = p.pipeline;
  const bool include_usage = r.s.include_usage;
  res.set_header("Cache-Control", "no-cache");
  ctx.engine->submit(job);  // before the headers: a full queue is a 429
  res.set_chunked_content_provider(
      "text/event-stream",
      [&ctx, job, popts, id, want_logprobs, include_usage, n_prompt,
       connected = client_connected(req)](size_t,
                                                                     httplib::DataSink& sink) {
        OutputPipeline pipeline(popts);
        auto chunk = [&](ojson delta, ojson finish, ojson logprobs) {
          ojson c = chunk_base(ctx, id, "chat.completion.chunk");
          ojson choice = {{"index", 0}, {"delta", std::move(delta)}};
          choice["logprobs"] = std::move(logprobs);
          choice["finish_reason"] = std::move(finish);
          c["choices"] = ojson::array({choice});
          return write_sse(sink, c);
        };
        if (!chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)) {
          ctx.engine->cancel(*job);
          return false;
        }
        size_t n_calls = 0;
        RunSummary s;
        try {
          s = run_job(*ctx.engine, job, pipeline, connected, [&](const Delta& d) {
            ojson delta = ojson::object();
            if (!d.content.empty()) delta["content"] = d.content;
            if (!d.reasoning.empty()) delta["reasoning_content"] = delta["reasoning"] = d.reasoning;
            if (!d.tool_calls.empty()) {
              delta["tool_calls"] = tool_calls_json(d.tool_calls, n_calls, true);
              n_calls += d.tool_calls.size();
            }
            if (delta.empty() && !want_logprobs) return sink.is_writable();
            return chunk(delta, nullptr, want_logprobs ? chat_logprobs(ctx, d.tokens) : nullptr);
          });
        } catch (const ApiError& e) {
          write_stream_error(sink, e);
          return true;
        }
        if (s.finish_reason == "cancelled") return false;
        chunk(ojson::object(), s.finish_reason, nullptr);
        finish_stream(ctx, sink, id, "chat.completion.chunk", s, n_prompt, include_usage);
        return true;
      },
      [&ctx, job](bool) { ctx.engine->cancel(*job); });
}

namespace {

// Legacy completions logprobs: {tokens, token_logprobs, top_logprobs: [{token: lp}], text_offset}.
void add_completion_logprobs(const Context& ctx, ojson& lp, const std::vector<TokenEvent>& tokens,
                             size_t& offset) {
  for (const auto& t : tokens) {
    const std::string text = token_text(ctx, t.token);
    lp["tokens"].push_back(text);
    lp["token_logprobs"].push_back(t.logprob);
    ojson top = ojson::object();
    for (const auto& [id, v] : t.top) top[token_text(ctx, id)] = v;
    lp["top_logprobs"].push_back(top);
    lp["text_offset"].push_back(offset);
    offset += text.size();
  }
}

ojson empty_completion_logprobs() {
  return {{"tokens", ojson::array()},
          {"token_logprobs", ojson::array()},
          {"top_logprobs", ojson::array()},
          {"text_offset", ojson::array()}};
}

}  // namespace

void handle_completion(const Context& ctx, const httplib::Request& req, httplib::Response& res) {
  const CompletionRequest r = parse_completion_request(parse_body(req.body), ctx.options.defaults);
  check_model(ctx, r.s.model);
  std::vector<int> prompt = r.prompt ? ctx.engine->tokenizer().encode(*r.prompt) : r.prompt_tokens;
  auto job = make_job(ctx, prompt, r.s, "prompt");
  const std::string prefix =
      r.echo ? (r.prompt ? *r.prompt : ctx.engine->tokenizer().decode(prompt)) : "";
  PipelineOptions popts;
  popts.stop = r.s.stop;
  const bool want_logprobs = r.s.top_logprobs >= 0;
  const size_t n_prompt = prompt.size();
  const std::string id = new_id("cmpl-");
  if (!r.s.stream) {
    OutputPipeline pipeline(popts);
    std::string text = prefix;
    ojson lp = empty_completion_logprobs();
    size_t offset = text.size();
    const auto connected = client_connected(req);
    RunSummary s = run_job(*ctx.engine, job, pipeline, connected, [&](const Delta& d) {
      text += d.content;
      if (want_logprobs) add_completion_logprobs(ctx, lp, d.tokens, offset);
      return connected();
    });
    ojson choice = {{"index", 0}, {"text", text}};
    choice["logprobs"] = want_logprobs ? lp : ojson(nullptr);
    choice["finish_reason"] = s.finish_reason;
    ojson body = chunk_base(ctx, id, "text_completion");
    body["choices"] = ojson::array({choice});
    body["usage"] = usage(s, n_prompt);
    send_json(res, body);
    return;
  }
  const bool include_usage = r.s.include_usage;
  res.set_header("Cache-Control", "no-cache");
  ctx.engine->submit(job);  // before the headers: a full queue is a 429
  res.set_chunked_content_provider(
      "text/event-stream",
      [&ctx, job, popts, id, want_logprobs, include_usage, n_prompt, prefix,
       connected = client_connected(req)](
          size_t, httplib::DataSink& sink) {
        OutputPipeline pipeline(popts);
        size_t offset = prefix.size();
        auto chunk = [&](const std::string& text, ojson finish, ojson logprobs) {
          ojson c = chunk_base(ctx, id, "text_completion");
          ojson choice = {{"index", 0}, {"text", text}};
          choice["logprobs"] = std::move(logprobs);
          choice["finish_reason"] = std::move(finish);
          c["choices"] = ojson::array({choice});
          return write_sse(sink, c);
        };
        if (!prefix.empty() && !chunk(prefix, nullptr, nullptr)) return false;
        RunSummary s;
        try {
          s = run_job(*ctx.engine, job, pipeline, connected, [&](const Delta& d) {
            if (d.content.empty() && !want_logprobs) return sink.is_writable();
            ojson lp = nullptr;
            if (want_logprobs) {
              lp = empty_completion_logprobs();
              add_completion_logprobs(ctx, lp, d.tokens, offset);
            }
            return chunk(d.content, nullptr, lp);
          });
        } catch (const ApiError& e) {
          write_stream_error(sink, e);
          return true;
        }
        if (s.finish_reason == "cancelled") return false;
        chunk("", s.finish_reason, nullptr);
        finish_stream(ctx, sink, id, "text_completion", s, n_prompt, include_usage);
        return true;
      },
      [&ctx, job](bool) { ctx.engine->cancel(*job); });
}

}  // namespace lmx::server
