#include "server/pipeline.h"

#include <cctype>

#include "server/api_error.h"

namespace lmx::server {

OutputPipeline::OutputPipeline(PipelineOptions o) : o_(std::move(o)), stop_(o_.stop) {
  if (o_.split_reasoning || o_.parse_tools) {
    // Harmony's channels are its reasoning markers, tools or not.
    const bool markers_of_format = o_.parse_tools || o_.tool_format == ToolFormat::kHarmony;
    OutputSplitter::Markers m =
        output_markers(markers_of_format ? o_.tool_format : ToolFormat::kNone);
    if (!o_.split_reasoning) m.think_start = "\x01never\x01";
    splitter_.emplace(m, o_.start_in_reasoning && o_.split_reasoning, o_.parse_tools);
  }
}

void OutputPipeline::route(Delta& d, std::vector<Segment> segs) {
  for (auto& s : segs) {
    if (s.kind == Segment::kReasoning) {
      d.reasoning += s.text;
    } else if (s.kind == Segment::kToolCall) {
      auto calls = parse_tool_block(o_.tool_format, s.text, o_.tools);
      if (calls.empty()) {
        // Not a well-formed call: keep the model's text, markers included.
        const auto m = output_markers(o_.tool_format);
        d.content +=
            (m.block_keeps_start ? "" : m.tool_start) + s.text + (s.closed ? m.tool_end : "");
      }
      for (auto& c : calls) d.tool_calls.push_back(std::move(c));
    } else {
      std::string& t = s.text;
      if (o_.parse_tools && o_.tool_format == ToolFormat::kLlama3 && !any_content_ && !bare_json_) {
        // Leading whitespace waits until the first visible character says JSON or text.
        size_t i = 0;
        while (i < t.size() && std::isspace(static_cast<unsigned char>(t[i]))) ++i;
        if (i == t.size()) {
          bare_ += t;
          continue;
        }
        bare_json_ = t[i] == '{';
        if (!bare_json_) {
          t = bare_ + t;
          bare_.clear();
        }
      }
      if (bare_json_) {
        bare_ += t;
        continue;
      }
      for (char c : t) any_content_ = any_content_ || !std::isspace(static_cast<unsigned char>(c));
      d.content += t;
    }
  }
}

Delta OutputPipeline::push(const TokenEvent& ev) {
  Delta d;
  if (ev.token >= 0) d.tokens.push_back(ev);
  const std::string text = stop_.push(ev.text);
  if (!splitter_) {
    d.content = text;
  } else {
    route(d, splitter_->push(text));
  }
  return d;
}

Delta OutputPipeline::flush() {
  Delta d;
  const std::string text = stop_.flush();
  if (!splitter_) {
    d.content = text;
    return d;
  }
  route(d, splitter_->push(text));
  route(d, splitter_->flush());
  if (!bare_.empty()) {
    auto calls = bare_json_ ? parse_bare_json_call(bare_) : std::vector<ToolCall>{};
    if (calls.empty()) d.content += bare_;
    for (auto& c : calls) d.tool_calls.push_back(std::move(c));
    bare_.clear();
  }
  return d;
}

RunSummary run_job(Engine& engine, std::shared_ptr<Job> job, OutputPipeline& pipeline,
                   const std::function<bool()>& connected,
                   const std::function<bool(const Delta&)>& sink) {
  RunSummary out;
  engine.submit(job);
  std::vector<TokenEvent> events;
  bool client_gone = false, timed_out = false;
  auto deliver = [&](const Delta& d) {
    out.has_tool_calls = out.has_tool_calls || !d.tool_calls.empty();
    if (!client_gone && !d.empty() && !sink(d)) {
      client_gone = true;
      engine.cancel(*job);
    }
  };
  while (job->pop(events, std::chrono::milliseconds(100))) {
    if (!client_gone && !timed_out) {
      if (job->deadline && std::chrono::steady_clock::now() > *job->deadline) {
        timed_out = true;
        engine.cancel(*job);
      } else if (connected && !connected()) {
        client_gone = true;
        engine.cancel(*job);
      }
    }
    for (const auto& ev : events) {
      if (pipeline.stopped()) break;
      if (ev.token >= 0) ++out.completion_tokens;
      deliver(pipeline.push(ev));
      if (pipeline.stopped()) engine.cancel(*job);
    }
  }
  out.result = job->result();
  if (!out.result.error.empty()) throw ApiError(500, out.result.error, "", "server_error");
  if (timed_out)
    throw ApiError(408,
                   "The request took longer than the server's --request-timeout of " +
                       std::to_string(job->timeout_seconds) + " s",
                   "", "timeout_error", "request_timeout");
  if (!client_gone) deliver(pipeline.flush());
  out.stopped_by_string = pipeline.stopped();
  if (client_gone) {
    out.finish_reason = "cancelled";
  } else if (out.has_tool_calls) {
    out.finish_reason = "tool_calls";
  } else if (out.stopped_by_string) {
    out.finish_reason = "stop";
  } else {
    out.finish_reason = out.result.finish_reason == "cancelled" ? "stop" : out.result.finish_reason;
  }
  return out;
}

}  // namespace lmx::server
