// The tool-call parsers. Byte 0 picks the format (hermes, llama3, mistral, gemma, gemma4,
// qwen3_coder with tools whose schemas type every kind of value, harmony), byte 1
// whether the output starts inside <think> (bit 0) and the chunk size (the rest, plus one); the
// remaining bytes are a model's raw output. It goes through the streaming OutputSplitter in those
// chunks, every tool block it yields through parse_tool_block, and the whole text through
// parse_tool_block and parse_bare_json_call. None of them may throw.
#include <iterator>

#include "fuzz_util.h"
#include "server/text_stream.h"
#include "server/tool_calls.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lmx::server;
  if (size < 2) return 0;
  constexpr ToolFormat kFormats[] = {
      ToolFormat::kHermes, ToolFormat::kLlama3,     ToolFormat::kMistral, ToolFormat::kGemma,
      ToolFormat::kGemma4, ToolFormat::kQwen3Coder, ToolFormat::kHarmony};
  static const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"properties": {"s": {"type": "string"}, "i": {"type": "integer"},
      "n": {"type": "number"}, "b": {"type": "boolean"}, "o": {"type": "object"},
      "u": {}, "v": {"description": "untyped"}, "x": {"type": "custom"}}}}}])");
  const ToolFormat f = kFormats[data[0] % std::size(kFormats)];
  const bool reasoning = data[1] & 1;
  const size_t chunk = (data[1] >> 1) + 1;
  const std::string all(reinterpret_cast<const char*>(data) + 2, size - 2);
  lmx::fuzz::expect_only<>("tool_calls", [&] {
    OutputSplitter split(output_markers(f), reasoning, true);
    std::vector<Segment> segs;
    for (size_t i = 0; i < all.size(); i += chunk)
      for (auto& s : split.push(all.substr(i, chunk))) segs.push_back(std::move(s));
    for (auto& s : split.flush()) segs.push_back(std::move(s));
    for (const auto& s : segs)
      if (s.kind == Segment::kToolCall) parse_tool_block(f, s.text, tools);
    parse_tool_block(f, all, tools);
    parse_bare_json_call(all);
  });
  return 0;
}
