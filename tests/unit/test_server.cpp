// lmx serve's text handling: stop strings and the reasoning / tool-call splitter fed one byte
// at a time must give what the whole text gives; tool-call parsers against mlx_lm's own
// (fixtures from scripts/gen_server_fixtures.py); request validation names the bad field; the
// prompt cache reuses the longest common prefix and respects its byte cap.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cache/kv_cache.h"
#include "cache/prompt_cache_lru.h"
#include "chat/chat_template.h"
#include "server/api_error.h"
#include "server/pipeline.h"
#include "server/requests.h"
#include "server/responses.h"
#include "server/server.h"
#include "server/text_stream.h"
#include "server/tool_calls.h"
#include "test_util.h"

namespace {

using namespace lmx::server;
using ojson = nlohmann::ordered_json;
namespace mx = mlx::core;

// Feeds `text` in pieces of `step` bytes and joins what comes out.
std::string stop_stream(const std::vector<std::string>& stops, const std::string& text, size_t step,
                        bool* stopped = nullptr) {
  StopMatcher m(stops);
  std::string out;
  for (size_t i = 0; i < text.size(); i += step) out += m.push(text.substr(i, step));
  out += m.flush();
  if (stopped) *stopped = m.stopped();
  return out;
}

TEST(StopMatcher, CutsAtTheEarliestStopInEverySplit) {
  const std::string text = "Hello wor\xc3\xa9ld. END of it ## more";
  for (size_t step = 1; step <= text.size(); ++step) {
    bool stopped = false;
    EXPECT_EQ(stop_stream({"## ", "END"}, text, step, &stopped), text.substr(0, text.find("END")))
        << "step " << step;
    EXPECT_TRUE(stopped);
  }
}

TEST(StopMatcher, HoldsBackOnlyWhatCouldStillMatch) {
  StopMatcher m({"</s>"});
  EXPECT_EQ(m.push("abc<"), "abc");
  EXPECT_EQ(m.push("/"), "");
  EXPECT_EQ(m.push("x"), "</x");  // no longer a prefix of the stop string
  EXPECT_EQ(m.flush(), "");
  EXPECT_FALSE(m.stopped());
  // No stop strings, or an empty one: everything passes at once.
  for (size_t step = 1; step < 5; ++step) EXPECT_EQ(stop_stream({""}, "a<b>c", step), "a<b>c");
}

std::vector<Segment> split_stream(const OutputSplitter::Markers& mk, bool in_think,
                                  const std::string& text, size_t step) {
  OutputSplitter s(mk, in_think, true);
  std::vector<Segment> all;
  auto add = [&](std::vector<Segment> v) {
    for (auto& seg : v) {
      if (!all.empty() && all.back().kind == seg.kind && seg.kind != Segment::kToolCall)
        all.back().text += seg.text;
      else
        all.push_back(seg);
    }
  };
  for (size_t i = 0; i < text.size(); i += step) add(s.push(text.substr(i, step)));
  add(s.flush());
  return all;
}

TEST(OutputSplitter, ReasoningContentAndToolBlocksInEverySplit) {
  const auto mk = output_markers(ToolFormat::kHermes);
  const std::string text =
      "<think>plan <b>it</b></think>Sure.<tool_call>{\"name\": \"f\"}</tool_call>"
      "<tool_call>{\"name\": \"g\"}</tool_call> done";
  for (size_t step = 1; step <= text.size(); ++step) {
    auto segs = split_stream(mk, false, text, step);
    ASSERT_EQ(segs.size(), 5u) << "step " << step;
    EXPECT_EQ(segs[0].kind, Segment::kReasoning);
    EXPECT_EQ(segs[0].text, "plan <b>it</b>");
    EXPECT_EQ(segs[1].kind, Segment::kContent);
    EXPECT_EQ(segs[1].text, "Sure.");
    EXPECT_EQ(segs[2].kind, Segment::kToolCall);
    EXPECT_EQ(segs[2].text, "{\"name\": \"f\"}");
    EXPECT_EQ(segs[3].text, "{\"name\": \"g\"}");
    EXPECT_EQ(segs[4].kind, Segment::kContent);
    EXPECT_EQ(segs[4].text, " done");
  }
}

TEST(OutputSplitter, PromptThatOpensThinkingAndBlocksRunningToTheEnd) {
  auto segs = split_stream(output_markers(ToolFormat::kHermes), true, "a</think>b", 1);
  ASSERT_EQ(segs.size(), 2u);
  EXPECT_EQ(segs[0].kind, Segment::kReasoning);
  EXPECT_EQ(segs[0].text, "a");
  EXPECT_EQ(segs[1].text, "b");
  // Mistral's [TOOL_CALLS] block has no end marker: it is closed by the end of the output.
  segs = split_stream(output_markers(ToolFormat::kMistral), false, "x[TOOL_CALLS][{}]", 2);
  ASSERT_EQ(segs.size(), 2u);
  EXPECT_EQ(segs[1].kind, Segment::kToolCall);
  EXPECT_EQ(segs[1].text, "[{}]");
}

TEST(ToolCalls, DetectsTheFormatFromTheTemplate) {
  EXPECT_EQ(detect_tool_format("{{ '<tool_call>' }}"), ToolFormat::kHermes);
  EXPECT_EQ(detect_tool_format("[TOOL_CALLS] {{ tools }}"), ToolFormat::kMistral);
  EXPECT_EQ(detect_tool_format("<|python_tag|>"), ToolFormat::kLlama3);
  EXPECT_EQ(detect_tool_format("<start_function_call>"), ToolFormat::kGemma);
  EXPECT_EQ(detect_tool_format("<|tool_call>"), ToolFormat::kGemma4);
  EXPECT_EQ(detect_tool_format("{{ messages }}"), ToolFormat::kNone);
  // Qwen3.5 / Qwen3-Coder: `<tool_call>` then a newline then `<function=`, the newline escaped
  // inside a Jinja string literal or raw; Hermes' <tool_call> alone stays hermes.
  EXPECT_EQ(detect_tool_format("{{- '<tool_call>\\n<function=' + tc.name + '>\\n' }}"),
            ToolFormat::kQwen3Coder);
  EXPECT_EQ(detect_tool_format("<tool_call>\n<function=x>"), ToolFormat::kQwen3Coder);
  EXPECT_EQ(detect_tool_format("<tool_call>\n{\"name\": ...}\n</tool_call> <function=x>"),
            ToolFormat::kHermes);
  // gpt-oss's template renders tools too, in harmony's own format.
  EXPECT_EQ(detect_tool_format("{{ tools }}<|start|>assistant<|channel|>final<|message|>"),
            ToolFormat::kHarmony);
}

TEST(ToolCalls, ParsersAgreeWithMlxLm) {
  std::ifstream f(lmx::test::data_path("server/tool_calls.json"));
  std::stringstream ss;
  ss << f.rdbuf();
  const ojson cases = ojson::parse(ss.str());
  ASSERT_GT(cases.size(), 10u);
  const std::map<std::string, ToolFormat> formats = {{"hermes", ToolFormat::kHermes},
                                                     {"mistral", ToolFormat::kMistral},
                                                     {"gemma", ToolFormat::kGemma},
                                                     {"gemma4", ToolFormat::kGemma4},
                                                     {"qwen3_coder", ToolFormat::kQwen3Coder}};
  std::set<std::string> seen;
  for (const auto& c : cases) {
    const std::string block = c["block"];
    seen.insert(c["format"].get<std::string>());
    auto calls = parse_tool_block(formats.at(c["format"]), block, c.value("tools", ojson()));
    ASSERT_EQ(calls.size(), c["calls"].size()) << c["format"] << ": " << block;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].name, c["calls"][i]["name"]) << block;
      // Same JSON value (key order kept: the arguments are shown to the client as text).
      EXPECT_EQ(ojson::parse(calls[i].arguments), c["calls"][i]["arguments"]) << block;
    }
  }
  EXPECT_EQ(seen.size(), formats.size());
}

TEST(ToolCalls, Llama3BareJsonAndParameters) {
  auto calls = parse_bare_json_call(R"( {"name": "f", "parameters": {"x": [1, 2]}} )");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "f");
  EXPECT_EQ(calls[0].arguments, R"({"x":[1,2]})");
  EXPECT_TRUE(parse_bare_json_call(R"({"answer": 42})").empty());
  EXPECT_TRUE(parse_bare_json_call("The answer is {").empty());
}

// Runs text through an OutputPipeline in pieces of `step` bytes and joins the deltas.
Delta pipe(PipelineOptions o, const std::string& text, size_t step) {
  OutputPipeline p(std::move(o));
  Delta all;
  auto add = [&](Delta d) {
    all.content += d.content;
    all.reasoning += d.reasoning;
    for (auto& c : d.tool_calls) all.tool_calls.push_back(c);
  };
  for (size_t i = 0; i < text.size(); i += step)
    add(p.push(TokenEvent{1, text.substr(i, step), 0, {}}));
  add(p.flush());
  return all;
}

TEST(OutputPipeline, ToolCallsReasoningAndStopsTogether) {
  PipelineOptions o;
  o.tool_format = ToolFormat::kHermes;
  o.parse_tools = true;
  o.split_reasoning = true;
  o.stop = {"<|eot|>"};
  const std::string text =
      "<think>need weather</think>Checking.<tool_call>\n{\"name\": \"weather\", "
      "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><|eot|>ignored";
  for (size_t step = 1; step <= text.size(); step += 3) {
    Delta d = pipe(o, text, step);
    EXPECT_EQ(d.reasoning, "need weather");
    EXPECT_EQ(d.content, "Checking.");
    ASSERT_EQ(d.tool_calls.size(), 1u) << "step " << step;
    EXPECT_EQ(d.tool_calls[0].name, "weather");
    EXPECT_EQ(d.tool_calls[0].arguments, R"({"city":"Oslo"})");
  }
  // Without tools offered the block is plain text; a malformed block stays text too.
  o.parse_tools = false;
  EXPECT_TRUE(pipe(o, text, 4).tool_calls.empty());
  o.parse_tools = true;
  Delta bad = pipe(o, "a<tool_call>{oops</tool_call>", 2);
  EXPECT_TRUE(bad.tool_calls.empty());
  EXPECT_EQ(bad.content, "a<tool_call>{oops</tool_call>");
}

// gpt-oss's harmony output: the analysis channel is the reasoning, the final channel the content,
// the headers between them dropped, in every split; tools offered or not.
TEST(OutputPipeline, HarmonyChannelsAreReasoningAndContent) {
  PipelineOptions o;
  o.tool_format = ToolFormat::kHarmony;
  o.split_reasoning = true;
  const std::string text =
      "<|channel|>analysis<|message|>User says hi. Answer.<|end|>"
      "<|start|>assistant<|channel|>final<|message|>Hello <|channel|!";
  for (bool tools : {false, true}) {
    o.parse_tools = tools;
    for (size_t step = 1; step <= text.size(); ++step) {
      Delta d = pipe(o, text, step);
      EXPECT_EQ(d.reasoning, "User says hi. Answer.") << "step " << step;
      EXPECT_EQ(d.content, "Hello <|channel|!") << "step " << step;
      EXPECT_TRUE(d.tool_calls.empty());
    }
  }
  // A final channel alone (no analysis) is all content.
  Delta d = pipe(o, "<|channel|>final<|message|>Hi.", 3);
  EXPECT_EQ(d.content, "Hi.");
  EXPECT_EQ(d.reasoning, "");
}

// Qwen3.5: a prompt that opens <think>, the reasoning closed by the model, then XML tool calls
// typed by the request's tools, in every split; a malformed block stays text.
TEST(OutputPipeline, Qwen35ThinkingAndXmlToolCalls) {
  PipelineOptions o;
  o.tool_format = ToolFormat::kQwen3Coder;
  o.parse_tools = true;
  o.split_reasoning = true;
  o.start_in_reasoning = true;
  o.tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"},
      "days": {"type": "integer"}, "metric": {"type": "boolean"}}}}}])");
  const std::string text =
      "\nOslo, three days.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
      "<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
      "<function=get_weather>\n<parameter=city>\nSan José\n</parameter>\n</function>\n"
      "</tool_call>";
  for (size_t step = 1; step <= text.size(); ++step) {
    Delta d = pipe(o, text, step);
    EXPECT_EQ(d.reasoning, "\nOslo, three days.\n") << "step " << step;
    EXPECT_EQ(d.content, "\n\nChecking.\n\n\n") << "step " << step;
    ASSERT_EQ(d.tool_calls.size(), 2u) << "step " << step;
    EXPECT_EQ(d.tool_calls[0].name, "get_weather");
    EXPECT_EQ(d.tool_calls[0].arguments, R"({"city":"Oslo","days":3,"metric":true})");
    EXPECT_EQ(d.tool_calls[1].arguments, R"({"city":"San José"})");
  }
  // An integer parameter that is not one: the block is kept as the model wrote it.
  const std::string bad =
      "</think>x<tool_call>\n<function=get_weather>\n<parameter=days>\n2.5\n</parameter>\n"
      "</function>\n</tool_call>";
  for (size_t step = 1; step <= bad.size(); ++step) {
    Delta d = pipe(o, bad, step);
    EXPECT_TRUE(d.tool_calls.empty());
    EXPECT_EQ(d.content, bad.substr(8)) << "step " << step;
  }
  // Cut off inside the block (max_tokens): text, and no invented closing marker.
  Delta cut = pipe(o, "</think><tool_call>\n<function=get_weather>\n<parameter=ci", 5);
  EXPECT_TRUE(cut.tool_calls.empty());
  EXPECT_EQ(cut.content, "<tool_call>\n<function=get_weather>\n<parameter=ci");
}

// Where lmx differs from mlx_lm's qwen3_coder (which reads one function from the first
// <function= to the last </function>): each function element of a block is a call.
TEST(ToolCalls, Qwen3CoderFunctionsInOneBlockAreSeparateCalls) {
  auto calls = parse_tool_block(ToolFormat::kQwen3Coder,
                                "\n<function=a>\n<parameter=x>\n1\n</parameter>\n</function>\n"
                                "<function=b>\n<parameter=y>\n2\n</parameter>\n</function>\n");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].name + calls[0].arguments, R"(a{"x":"1"})");
  EXPECT_EQ(calls[1].name + calls[1].arguments, R"(b{"y":"2"})");
}

// gpt-oss: an analysis message (reasoning), then a commentary message addressed to a function,
// in both header orders; <|call|> is an EOS token, so the output usually ends without it.
TEST(OutputPipeline, HarmonyToolCallsInBothHeaderOrders) {
  PipelineOptions o;
  o.tool_format = ToolFormat::kHarmony;
  o.parse_tools = true;
  o.split_reasoning = true;
  const std::string analysis = "<|channel|>analysis<|message|>Need the weather.<|end|>";
  const std::vector<std::string> calls = {
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
      "<|message|>{\"city\": \"Oslo\"}",
      "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
      "{\"city\": \"Oslo\"}<|call|>",
      "<|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>"
      "{\"city\": \"Oslo\"}<|call|>"};
  for (const auto& call : calls) {
    for (const std::string& text : {analysis + call, call.substr(18)}) {
      for (size_t step = 1; step <= text.size(); ++step) {
        Delta d = pipe(o, text, step);
        EXPECT_EQ(d.reasoning, text == call.substr(18) ? "" : "Need the weather.") << text;
        EXPECT_EQ(d.content, "") << text << " step " << step;
        ASSERT_EQ(d.tool_calls.size(), 1u) << text << " step " << step;
        EXPECT_EQ(d.tool_calls[0].name, "get_weather");
        EXPECT_EQ(d.tool_calls[0].arguments, R"({"city":"Oslo"})");
      }
    }
  }
  // A preamble (commentary without a recipient) is content; a built-in tool (browser.search)
  // and arguments that are not a JSON object are kept as text.
  Delta d = pipe(o,
                 "<|channel|>commentary<|message|>Looking it up.<|end|><|start|>assistant"
                 "<|channel|>commentary to=browser.search <|constrain|>json<|message|>{}",
                 4);
  EXPECT_TRUE(d.tool_calls.empty());
  EXPECT_EQ(d.content,
            "Looking it up.<|channel|>commentary to=browser.search <|constrain|>json<|message|>{}");
  d = pipe(o, "<|channel|>commentary to=functions.f json<|message|>not json<|call|>", 3);
  EXPECT_TRUE(d.tool_calls.empty());
  EXPECT_EQ(d.content, "<|channel|>commentary to=functions.f json<|message|>not json<|call|>");
  // No tools offered: the call stays text.
  o.parse_tools = false;
  EXPECT_TRUE(pipe(o, calls[0], 2).tool_calls.empty());
}

// Bytes that are not UTF-8, and every truncation and one-byte corruption of well-formed blocks,
// never throw out of the parsers (the server would answer 500).
TEST(ToolCalls, MalformedAndInvalidUtf8BlocksNeverThrow) {
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "f",
      "parameters": {"properties": {"s": {"type": "string"}, "i": {"type": "integer"},
      "o": {"type": "object"}, "x": {"type": "custom"}, "u": {}}}}}])");
  const std::string q =
      "\n<function=f>\n<parameter=s>\n\xff\xfe\n</parameter>\n<parameter=x>\n['\xc3', (1, {2: "
      "None})]\n</parameter>\n<parameter=o>\n{\"k\": \"\xe2\x82\"}\n</parameter>\n"
      "<parameter=\xff>\n1\n</parameter>\n</function>\n";
  auto calls = parse_tool_block(ToolFormat::kQwen3Coder, q, tools);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_TRUE(ojson::accept(calls[0].arguments)) << calls[0].arguments;
  const std::string h =
      " to=functions.f\xff<|channel|>commentary json<|message|>{\"a\": \"\xc3\"}<|call|>";
  const std::vector<std::pair<ToolFormat, std::string>> blocks = {{ToolFormat::kQwen3Coder, q},
                                                                  {ToolFormat::kHarmony, h}};
  for (const auto& [f, block] : blocks) {
    for (size_t n = 0; n <= block.size(); ++n) {
      EXPECT_NO_THROW(parse_tool_block(f, block.substr(0, n), tools));
      for (const char c : {'\0', '<', '>', '\n', '\'', '(', '{', '"', '\\', '\x80'}) {
        std::string m = block;
        if (n < m.size()) m[n] = c;
        EXPECT_NO_THROW({
          for (const auto& call : parse_tool_block(f, m, tools))
            EXPECT_TRUE(ojson::accept(call.arguments));
        });
      }
    }
  }
}

// gpt-oss's effort: chat's reasoning_effort and the Responses API's reasoning.effort become the
// template's reasoning_effort (the reduced harmony template of the server tests renders it).
TEST(ServerRequests, ReasoningEffortReachesTheTemplate) {
  std::ifstream f(lmx::test::source_dir() / "tests/server/harmony_reduced.jinja");
  std::stringstream ss;
  ss << f.rdbuf();
  const auto tmpl = lmx::chat::ChatTemplate::from_source(ss.str());
  auto render = [&](const ChatRequest& r) {
    lmx::chat::TemplateOptions o;
    o.kwargs = nlohmann::json::parse(r.template_kwargs.dump());
    return tmpl.render(nlohmann::json::parse(r.messages.dump()), o);
  };
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  auto chat = [&](const std::string& extra) {
    return render(parse_chat_request(parse_body("{" + msgs + extra + "}"), SamplingDefaults{}));
  };
  EXPECT_NE(chat("").find("Reasoning: medium\n"), std::string::npos);
  EXPECT_NE(chat(R"(, "reasoning_effort": "high")").find("Reasoning: high\n"), std::string::npos);
  ResponseStore store(std::chrono::seconds(60), 1 << 20);
  const ojson body = ojson::parse(R"({"input": "hi", "reasoning": {"effort": "low"}})");
  const std::string text =
      render(parse_chat_request(responses_to_chat(body, store), SamplingDefaults{}));
  EXPECT_NE(text.find("Reasoning: low\n"), std::string::npos) << text;
  EXPECT_NE(text.find("<|start|>user<|message|>hi<|end|><|start|>assistant"), std::string::npos);
}

TEST(OutputPipeline, Llama3BareJsonOutputIsAToolCall) {
  PipelineOptions o;
  o.tool_format = ToolFormat::kLlama3;
  o.parse_tools = true;
  Delta d = pipe(o, R"(  {"name": "f", "parameters": {"x": 1}})", 1);
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "f");
  EXPECT_EQ(d.content, "");
  d = pipe(o, "Plain {answer}", 3);
  EXPECT_TRUE(d.tool_calls.empty());
  EXPECT_EQ(d.content, "Plain {answer}");
}

std::string bad_param(const std::string& body, bool chat = true) {
  try {
    if (chat)
      parse_chat_request(parse_body(body), SamplingDefaults{});
    else
      parse_completion_request(parse_body(body), SamplingDefaults{});
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find(e.param), std::string::npos) << e.what();
    return e.param;
  }
  return "(accepted)";
}

TEST(ServerRequests, ErrorsNameTheField) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(bad_param("[1]"), "");
  EXPECT_EQ(bad_param("{\"messages\": []}"), "messages");
  EXPECT_EQ(bad_param(R"({"messages": [{"role": "robot", "content": "x"}]})"), "messages[0].role");
  EXPECT_EQ(bad_param("{" + msgs + R"(, "temperature": "hot"})"), "temperature");
  EXPECT_EQ(bad_param("{" + msgs + R"(, "temperature": -1})"), "temperature");
  EXPECT_EQ(bad_param("{" + msgs + R"(, "top_p": 0})"), "top_p");
  EXPECT_EQ(bad_param("{" + msgs + R"(, "max_tokens": 1.5})"), "max_tokens");
  EXPECT_EQ(bad_param("{" + msgs + R"(, "max_completion_tokens": -2})"), "max_completion_tokens");
  EXPECT_EQ(bad_param("{" + msgs + R"(, "logit_bias": {"x": 1}})"), "logit_bias");
  EXPECT_EQ(bad_param("{" + msgs + R"(, "stop": [1]})"), "stop");
  EXPECT_EQ(bad_param("{" + msgs + R"(, "tools": [{"type": "function"}]})"), "tools");
  EXPECT_EQ(bad_param("{" + msgs + R"(, "top_logprobs": 3})"), "top_logprobs");
  EXPECT_EQ(bad_param("{" + msgs + R"(, "response_format": {"type": "xml"}})"),
            "response_format.type");
  EXPECT_EQ(bad_param("{" + msgs + R"(, "response_format": "json"})"), "response_format");
  EXPECT_EQ(bad_param("{" + msgs + R"(, "response_format": {"type": "json_schema"}})"),
            "response_format.json_schema");
  EXPECT_EQ(
      bad_param("{" + msgs + R"(, "response_format": {"type": "json_schema", "json_schema": {}}})"),
      "response_format.json_schema.schema");
  EXPECT_EQ(bad_param("{" + msgs + R"(, "response_format": {"type": "json_object"}})"),
            "(accepted)");
  EXPECT_EQ(bad_param("{" + msgs + R"(, "tool_choice": "required"})"), "tool_choice");
  const std::string tools = R"(, "tools": [{"type": "function", "function": {"name": "f"}}])";
  EXPECT_EQ(bad_param("{" + msgs + tools +
                      R"(, "tool_choice": {"type": "function", "function": {"name": "g"}}})"),
            "tool_choice");
  EXPECT_EQ(bad_param("{" + msgs + tools + R"(, "tool_choice": {"type": "function"}})"),
            "tool_choice");
  EXPECT_EQ(bad_param("{" + msgs + tools +
                      R"(, "tool_choice": {"type": "function", "function": {"name": "f"}}})"),
            "(accepted)");
  EXPECT_EQ(bad_param(R"({"prompt": {"a": 1}})", false), "prompt");
  EXPECT_EQ(bad_param(R"({"prompt": "x", "logprobs": 99})", false), "logprobs");
  EXPECT_EQ(bad_param(R"({"prompt": [4294967297]})", false), "prompt");
  EXPECT_EQ(bad_param("{" + msgs + R"(, "max_tokens": 3, "stop": "x"})"), "(accepted)");
}

std::string bad_embedding_param(const std::string& body) {
  try {
    parse_embedding_request(parse_body(body));
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find(e.param), std::string::npos) << e.what();
    return e.param;
  }
  return "(accepted)";
}

TEST(ServerRequests, EmbeddingInputShapes) {
  EmbeddingRequest r = parse_embedding_request(parse_body(R"({"input": "a"})"));
  EXPECT_EQ(r.texts, std::vector<std::string>{"a"});
  EXPECT_FALSE(r.base64);
  r = parse_embedding_request(parse_body(R"({"input": ["a", "b"], "encoding_format": "base64"})"));
  EXPECT_EQ(r.texts, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(r.base64);
  r = parse_embedding_request(parse_body(R"({"input": [1, 2, 3]})"));
  EXPECT_EQ(r.token_ids, (std::vector<std::vector<int>>{{1, 2, 3}}));
  r = parse_embedding_request(parse_body(R"({"input": [[1], [2, 3]], "dimensions": 8})"));
  EXPECT_EQ(r.token_ids, (std::vector<std::vector<int>>{{1}, {2, 3}}));
  EXPECT_EQ(r.dimensions, 8);
  EXPECT_EQ(bad_embedding_param("{}"), "input");
  EXPECT_EQ(bad_embedding_param(R"({"input": ""})"), "input");
  EXPECT_EQ(bad_embedding_param(R"({"input": []})"), "input");
  EXPECT_EQ(bad_embedding_param(R"({"input": 5})"), "input");
  EXPECT_EQ(bad_embedding_param(R"({"input": ["a", 1]})"), "input[1]");
  EXPECT_EQ(bad_embedding_param(R"({"input": ["a", ""]})"), "input[1]");
  EXPECT_EQ(bad_embedding_param(R"({"input": [[1], []]})"), "input[1]");
  EXPECT_EQ(bad_embedding_param(R"({"input": [[1], [1.5]]})"), "input[1]");
  EXPECT_EQ(bad_embedding_param(R"({"input": [1, "a"]})"), "input");
  EXPECT_EQ(bad_embedding_param(R"({"input": [4294967297]})"), "input");  // not 1 after a wrap
  EXPECT_EQ(bad_embedding_param(R"({"input": "a", "encoding_format": "int8"})"), "encoding_format");
  EXPECT_EQ(bad_embedding_param(R"({"input": "a", "dimensions": 0})"), "dimensions");
}

TEST(ServerRequests, FieldsReachTheOptions) {
  const ChatRequest r = parse_chat_request(
      parse_body(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
        {"type": "text", "text": "b"}]}, {"role": "assistant", "content": null, "tool_calls":
        [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"z\": 1}"}}]}],
        "max_completion_tokens": 7, "temperature": 0.5, "top_k": 3, "seed": 9,
        "logit_bias": {"12": -100}, "stop": "\n", "stream": true,
        "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2,
        "reasoning_effort": "none"})"),
      SamplingDefaults{});
  EXPECT_EQ(r.s.gen.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.s.gen.sampler.temp, 0.5f);
  EXPECT_EQ(r.s.gen.sampler.top_k, 3);
  EXPECT_EQ(r.s.gen.seed, 9u);
  ASSERT_EQ(r.s.gen.processors.logit_bias.size(), 1u);
  EXPECT_EQ(r.s.gen.processors.logit_bias[0].first, 12);
  EXPECT_EQ(r.s.stop, std::vector<std::string>{"\n"});
  EXPECT_TRUE(r.s.stream && r.s.include_usage);
  EXPECT_EQ(r.s.top_logprobs, 2);
  EXPECT_EQ(r.template_kwargs["enable_thinking"], false);
  EXPECT_EQ(r.messages[0]["content"], "ab");
  EXPECT_EQ(r.messages[1]["content"], "");
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["function"]["arguments"]["z"], 1);
}

TEST(ServerRequests, AnthropicToOpenAIMessages) {
  const ChatRequest r = parse_anthropic_request(
      parse_body(R"({"max_tokens": 5, "system": [{"type": "text", "text": "be brief"}],
        "stop_sequences": ["END"], "messages": [{"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "w",
         "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
         "content": "cold"}]}],
        "tools": [{"name": "w", "input_schema": {"type": "object"}}]})"),
      SamplingDefaults{});
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[0]["content"], "be brief");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"]["city"], "Oslo");
  EXPECT_EQ(r.messages[3]["role"], "tool");
  EXPECT_EQ(r.messages[3]["content"], "cold");
  EXPECT_EQ(r.s.stop, std::vector<std::string>{"END"});
  ASSERT_TRUE(r.tools);
  EXPECT_EQ((*r.tools)[0]["function"]["name"], "w");
  try {
    parse_anthropic_request(parse_body(R"({"messages": [{"role": "user", "content": "x"}]})"),
                            SamplingDefaults{});
    ADD_FAILURE() << "max_tokens is required";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "max_tokens");
  }
}

TEST(ServerRequests, ToolChoiceAndResponseFormat) {
  const std::string a = R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"name": "w", "input_schema": {"type": "object"}}], "tool_choice": )";
  ChatRequest r = parse_anthropic_request(parse_body(a + R"({"type": "any"}})"), {});
  EXPECT_EQ(r.tool_choice, "required");
  EXPECT_TRUE(r.parallel_tool_calls);
  r = parse_anthropic_request(
      parse_body(a + R"({"type": "tool", "name": "w", "disable_parallel_tool_use": true}})"), {});
  EXPECT_EQ((r.tool_choice + ":" + r.tool_name), "function:w");
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_THROW(parse_anthropic_request(parse_body(a + R"({"type": "tool", "name": "q"}})"), {}),
               ApiError);
  EXPECT_THROW(parse_anthropic_request(parse_body(a + R"({"type": "sometimes"}})"), {}), ApiError);
  r = parse_chat_request(parse_body(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
      "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}},
      "parallel_tool_calls": false})"),
                         {});
  ASSERT_TRUE(r.s.json_schema);
  EXPECT_EQ((*r.s.json_schema)["properties"]["a"]["type"], "integer");
  EXPECT_FALSE(r.s.json_object);
  EXPECT_FALSE(r.parallel_tool_calls);
  const CompletionRequest c = parse_completion_request(
      parse_body(R"({"prompt": "x", "response_format": {"type": "json_object"}})"), {});
  EXPECT_TRUE(c.s.json_object);
}

// A one-layer cache holding `n` tokens of (1, 1, n, 4) float K/V.
lmx::Cache cache_of(int n) {
  lmx::Cache c;
  c.push_back(std::make_unique<lmx::KVCache>());
  auto kv = mx::zeros({1, 1, n, 4});
  c[0]->update_and_fetch(kv, kv);
  return c;
}

TEST(ServerPromptCache, LongestCommonPrefixTrimmedAndKeyed) {
  lmx::PromptCacheLRU lru(10, std::nullopt);
  lru.put("m", {1, 2, 3, 4, 5}, cache_of(5));
  lru.put("m", {1, 2, 9}, cache_of(3));
  lru.put("other", {1, 2, 3, 4, 5, 6}, cache_of(6));
  auto hit = lru.take("m", {1, 2, 3, 4, 7, 8});
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->reused, 4u);
  EXPECT_EQ(hit->cache[0]->offset(), 4);
  EXPECT_EQ(lru.entries(), 2u);  // taken out while in use
  // The whole prompt is never reused: its last token has to run.
  lru.put("m", {1, 2, 3}, cache_of(3));
  hit = lru.take("m", {1, 2, 3});
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->reused, 2u);
  EXPECT_FALSE(lru.take("m", {7, 7}));
  EXPECT_FALSE(lru.take("nobody", {1, 2, 3}));
}

TEST(ServerPromptCache, TrimsByTheCachesOffsetWhenItHoldsMoreThanItsTokens) {
  // A step queued ahead fed one token (an EOS) that the caller never saw: 4 cached, 3 known.
  lmx::PromptCacheLRU lru(10, std::nullopt);
  lru.put("m", {1, 2, 3}, cache_of(4));
  auto hit = lru.take("m", {1, 2, 3, 9});
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->reused, 3u);
  EXPECT_EQ(hit->cache[0]->offset(), 3);
}

TEST(ServerPromptCache, EvictsLeastRecentlyUsedPastTheByteCap) {
  const size_t one = lmx::cache_bytes(cache_of(3));
  lmx::PromptCacheLRU lru(10, one * 2);
  lru.put("m", {1, 1, 1}, cache_of(3));
  lru.put("m", {2, 2, 2}, cache_of(3));
  lru.put("m", {3, 3, 3}, cache_of(3));
  EXPECT_EQ(lru.entries(), 2u);
  EXPECT_LE(lru.bytes(), one * 2);
  EXPECT_FALSE(lru.take("m", {1, 1, 1, 1}));  // the oldest went first
  EXPECT_TRUE(lru.take("m", {3, 3, 3, 3}));
}

// The API key check: equal only for the exact key, whatever the length or the shared prefix.
TEST(ServerAuth, SameSecretOnlyForTheExactKey) {
  EXPECT_TRUE(same_secret("sekrit", "sekrit"));
  EXPECT_FALSE(same_secret("sekri", "sekrit"));
  EXPECT_FALSE(same_secret("sekritt", "sekrit"));
  EXPECT_FALSE(same_secret("sekriT", "sekrit"));
  EXPECT_FALSE(same_secret("", "sekrit"));
  EXPECT_FALSE(same_secret(std::string("sekrit\0", 7), "sekrit"));
  EXPECT_FALSE(same_secret(std::string(6, '\0'), "sekrit"));
  EXPECT_TRUE(same_secret("", ""));
  EXPECT_FALSE(same_secret("x", ""));
}

}  // namespace
