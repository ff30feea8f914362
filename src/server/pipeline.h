// The HTTP side of a generation: token events from the engine through stop strings and the
// reasoning / tool-call splitter into deltas that the endpoint formats.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/engine.h"
#include "server/text_stream.h"
#include "server/tool_calls.h"

namespace lmx::server {

struct Delta {
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;
  std::vector<TokenEvent> tokens;  // the tokens generated since the last delta (for logprobs)
  bool empty() const {
    return content.empty() && reasoning.empty() && tool_calls.empty() && tokens.empty();
  }
};

struct PipelineOptions {
  std::vector<std::string> stop;
  ToolFormat tool_format = ToolFormat::kNone;
  bool parse_tools = false;         // the request offered tools
  ojson tools;                      // those tools (OpenAI form): qwen3_coder types values by them
  bool split_reasoning = false;     // chat: <think> blocks go to `reasoning`
  bool start_in_reasoning = false;  // the prompt ends inside an open <think>
};

class OutputPipeline {
 public:
  explicit OutputPipeline(PipelineOptions o);
  Delta push(const TokenEvent& ev);
  Delta flush();
  bool stopped() const { return stop_.stopped(); }  // a stop string matched

 private:
  void route(Delta& d, std::vector<Segment> segs);
  PipelineOptions o_;
  StopMatcher stop_;
  std::optional<OutputSplitter> splitter_;
  bool any_content_ = false;
  bool bare_json_ = false;  // llama3: the output began with '{', held back to parse at the end
  std::string bare_;
};

struct RunSummary {
  JobResult result;
  std::string finish_reason;  // "stop", "length", "tool_calls", "cancelled"
  int completion_tokens = 0;
  bool stopped_by_string = false;
  bool has_tool_calls = false;
};

// Submits the job and feeds every delta to `sink` until the end; `sink` returning false, or
// `connected` (polled every 100 ms, also while the job is queued or prefilling) returning false,
// means the client went away and cancels the job. Past the job's deadline (--request-timeout)
// the job is cancelled and ApiError 408 thrown. Throws ApiError(500) when generation failed.
RunSummary run_job(Engine& engine, std::shared_ptr<Job> job, OutputPipeline& pipeline,
                   const std::function<bool()>& connected,
                   const std::function<bool(const Delta&)>& sink);

}  // namespace lmx::server
