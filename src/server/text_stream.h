// Streaming text post-processing on decoded text: stop strings with hold-back, and the split of
// the output into content, reasoning (<think>...</think>) and tool-call blocks.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace lmx::server {

// Matches stop strings across token boundaries. push() returns the text that can be emitted now:
// everything except a tail that may still grow into a stop string. Once a stop string is found
// the text before it is returned and stopped() turns true; the stop string itself is dropped.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  std::string push(const std::string& text);
  std::string flush();  // end of generation: the held-back tail
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

// Length of the longest suffix of `text` that is a proper prefix of one of `markers`, so that
// the caller holds it back until the next text decides.
size_t partial_marker_suffix(const std::string& text, const std::vector<std::string>& markers);

// A piece of the output in one channel.
struct Segment {
  enum Kind { kContent, kReasoning, kToolCall } kind;
  std::string text;    // for kToolCall: the whole raw block between its markers
  bool closed = true;  // kToolCall: its end marker came (false: the output ended inside it)
};

// Splits streamed text at the markers of reasoning and tool calls. Reasoning and content come
// out as soon as they cannot be part of a marker; a tool-call block only when it is closed (or
// at flush, for formats whose block runs to the end of the output).
class OutputSplitter {
 public:
  struct Markers {
    std::string think_start = "<think>", think_end = "</think>";
    std::string tool_start, tool_end;  // tool_end "" = the block runs to the end of the output
    // Other markers that also open a tool block (harmony's two header orders).
    std::vector<std::string> more_tool_starts = {};
    // The block's text begins with the start marker that opened it (harmony: the header names
    // the function).
    bool block_keeps_start = false;
    // Headers dropped from the content (harmony's "<|start|>assistant", "<|channel|>final...").
    std::vector<std::string> drop = {};
  };
  // start_in_reasoning: the prompt ended inside an open <think> (a template that opens it).
  OutputSplitter(Markers markers, bool start_in_reasoning, bool parse_tools);
  std::vector<Segment> push(const std::string& text);
  std::vector<Segment> flush();

 private:
  void emit(std::vector<Segment>& out, Segment::Kind kind, std::string text);
  Markers m_;
  bool parse_tools_;
  enum State { kNormal, kThinking, kInTool } state_;
  std::string pending_;
  std::string block_head_;  // block_keeps_start: the marker that opened the current block
};

}  // namespace lmx::server
