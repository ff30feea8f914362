// Inputs the libFuzzer targets of tests/fuzz found (bench/fuzz.sh, docs/reliability.md), each run
// through the parser that failed on it, with what it must do instead.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "server/tool_calls.h"

namespace {

using lmx::server::ToolFormat;

// fuzz_tool_calls: a gemma call whose bare value holds bytes that are not UTF-8 threw
// nlohmann's type_error 316 out of parse_tool_block (the server answered 500).
TEST(FuzzRegressions, GemmaToolCallWithInvalidUtf8Value) {
  const std::string block =
      "call:f{a:\x8d\x8d"
      "rt,n:2,s:<escape>x\xff<escape>}";
  for (ToolFormat f : {ToolFormat::kGemma}) {
    const auto calls = lmx::server::parse_tool_block(f, block);
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].name, "f");
    const auto args = nlohmann::json::parse(calls[0].arguments);
    EXPECT_EQ(args["a"], "\xef\xbf\xbd\xef\xbf\xbdrt");  // U+FFFD per invalid byte
    EXPECT_EQ(args["n"], 2);
    EXPECT_EQ(args["s"], "x\xef\xbf\xbd");
  }
  const std::string g4 = "call:g{k\xc3:<|\"|>v<|\"|>}";
  const auto calls = lmx::server::parse_tool_block(ToolFormat::kGemma4, g4);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(calls[0].arguments).begin().key(), "k\xef\xbf\xbd");
}

}  // namespace
