#include "server/text_stream.h"

#include <algorithm>

namespace lmx::server {

size_t partial_marker_suffix(const std::string& text, const std::vector<std::string>& markers) {
  size_t longest = 0;
  for (const auto& m : markers) {
    if (m.empty()) continue;
    for (size_t k = std::min(text.size(), m.size() - 1); k > longest; --k) {
      if (text.compare(text.size() - k, k, m, 0, k) == 0) {
        longest = k;
        break;
      }
    }
  }
  return longest;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string StopMatcher::push(const std::string& text) {
  if (stopped_) return "";
  pending_ += text;
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  const size_t hold = partial_marker_suffix(pending_, stops_);
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(pending_);
  return stopped_ ? "" : out;
}

OutputSplitter::OutputSplitter(Markers markers, bool start_in_reasoning, bool parse_tools)
    : m_(std::move(markers)),
      parse_tools_(parse_tools && !m_.tool_start.empty()),
      state_(start_in_reasoning ? kThinking : kNormal) {}

void OutputSplitter::emit(std::vector<Segment>& out, Segment::Kind kind, std::string text) {
  if (text.empty() && kind != Segment::kToolCall) return;
  if (!out.empty() && out.back().kind == kind && kind != Segment::kToolCall) {
    out.back().text += text;
  } else {
    out.push_back(Segment{kind, std::move(text)});
  }
}

std::vector<Segment> OutputSplitter::push(const std::string& text) {
  std::vector<Segment> out;
  pending_ += text;
  while (true) {
    if (state_ == kNormal) {
      size_t think = pending_.find(m_.think_start);
      size_t tool = std::string::npos, tool_size = 0;
      if (parse_tools_) {
        tool = pending_.find(m_.tool_start), tool_size = m_.tool_start.size();
        for (const auto& t : m_.more_tool_starts) {
          const size_t at = pending_.find(t);
          if (at < tool) tool = at, tool_size = t.size();
        }
      }
      size_t drop = std::string::npos, drop_size = 0;
      for (const auto& d : m_.drop) {
        const size_t at = pending_.find(d);
        if (at < drop) drop = at, drop_size = d.size();
      }
      if (drop < think && drop < tool) {
        emit(out, Segment::kContent, pending_.substr(0, drop));
        pending_.erase(0, drop + drop_size);
        continue;
      }
      if (think == std::string::npos && tool == std::string::npos) {
        std::vector<std::string> markers{m_.think_start};
        if (parse_tools_) {
          markers.push_back(m_.tool_start);
          markers.insert(markers.end(), m_.more_tool_starts.begin(), m_.more_tool_starts.end());
        }
        markers.insert(markers.end(), m_.drop.begin(), m_.drop.end());
        const size_t hold = partial_marker_suffix(pending_, markers);
        emit(out, Segment::kContent, pending_.substr(0, pending_.size() - hold));
        pending_.erase(0, pending_.size() - hold);
        return out;
      }
      const bool is_tool = tool < think;
      const size_t at = is_tool ? tool : think;
      emit(out, Segment::kContent, pending_.substr(0, at));
      if (is_tool && m_.block_keeps_start) block_head_ = pending_.substr(at, tool_size);
      pending_.erase(0, at + (is_tool ? tool_size : m_.think_start.size()));
      state_ = is_tool ? kInTool : kThinking;
    } else if (state_ == kThinking) {
      const size_t end = pending_.find(m_.think_end);
      if (end == std::string::npos) {
        const size_t hold = partial_marker_suffix(pending_, {m_.think_end});
        emit(out, Segment::kReasoning, pending_.substr(0, pending_.size() - hold));
        pending_.erase(0, pending_.size() - hold);
        return out;
      }
      emit(out, Segment::kReasoning, pending_.substr(0, end));
      pending_.erase(0, end + m_.think_end.size());
      state_ = kNormal;
    } else {
      const size_t end = m_.tool_end.empty() ? std::string::npos : pending_.find(m_.tool_end);
      if (end == std::string::npos) return out;
      emit(out, Segment::kToolCall, block_head_ + pending_.substr(0, end));
      block_head_.clear();
      pending_.erase(0, end + m_.tool_end.size());
      state_ = kNormal;
    }
  }
}

std::vector<Segment> OutputSplitter::flush() {
  std::vector<Segment> out;
  const Segment::Kind kind = state_ == kNormal     ? Segment::kContent
                             : state_ == kThinking ? Segment::kReasoning
                                                   : Segment::kToolCall;
  emit(out, kind, kind == Segment::kToolCall ? block_head_ + pending_ : std::move(pending_));
  if (kind == Segment::kToolCall) out.back().closed = false;
  pending_.clear();
  block_head_.clear();
  state_ = kNormal;
  return out;
}

}  // namespace lmx::server
