// The JSON-schema automaton (src/constrain) against Python's json + jsonschema verdicts
// (scripts/gen_json_schema_fixtures.py), schema errors, and the token masks built from it.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "constrain/token_constraint.h"
#include "constrain/tool_grammar.h"
#include "core/error.h"
#include "core/json.h"
#include "test_util.h"

namespace lmx {
namespace {

using namespace lmx::constrain;

TEST(JsonSchema, AutomatonAgreesWithPythonJsonschema) {
  json cases = read_json_file(test::data_path("json_schema/cases.json"));
  ASSERT_GE(cases.size(), 8u);
  for (const auto& c : cases) {
    const std::string name = c.at("name").get<std::string>();
    JsonAutomaton a(compile_schema(c.at("schema")));
    int samples = 0, rejected = 0;
    for (const auto& t : c.at("texts")) {
      const std::string text = t.at("text").get<std::string>();
      const bool match = a.matches(text);
      if (t.at("sample").get<bool>()) {
        ++samples;
        EXPECT_TRUE(match) << name << ": a valid sample is rejected: " << text;
      }
      if (!t.at("valid").get<bool>()) {
        rejected += !match;
        EXPECT_FALSE(match) << name << ": accepts what jsonschema rejects: " << text;
      }
    }
    EXPECT_GE(samples, 5) << name;
    EXPECT_GE(rejected, 100) << name;
  }
}

TEST(JsonSchema, AnyJsonAndObjectOnly) {
  JsonAutomaton any(any_json_grammar(false)), obj(any_json_grammar(true));
  for (const char* v : {"1", "-0.5e+10", "\"x\"", "[1,[2,{}]]", "{\"a\":{\"b\":[null]}}", "true"})
    EXPECT_TRUE(any.matches(v)) << v;
  EXPECT_TRUE(any.matches("{\"a\": 1, \"b\": [1, 2]}"));  // one space after ':' and ','
  for (const char* v : {"01", "1.", "[1,]", "{\"a\"}", "\"\\x\"", "nul", "{} ", "-", "1e",
                        "{\"a\":  1}", "{\"a\" :1}", " 1", "[ 1]", "[1 ,2]"})
    EXPECT_FALSE(any.matches(v)) << v;
  EXPECT_TRUE(obj.matches("{\"a\":1}"));
  EXPECT_FALSE(obj.matches("[1]"));
  EXPECT_FALSE(obj.matches("1"));
}

// Tool-call grammars: the family's wrapper as raw text around {"name", "arguments"} (a
// Sequence of literal, the tool's schema, literal), one of several tools, and repeated calls.
TEST(JsonSchema, ToolCallGrammar) {
  const auto args = [](const char* schema) { return compile_schema(json::parse(schema)); };
  std::vector<std::pair<std::string, Grammar>> tools;
  tools.emplace_back("get_weather", args(R"({"type":"object","properties":{
      "city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]})"));
  tools.emplace_back("now", args(R"({"type":"object","properties":{}})"));
  const ToolCallSyntax hermes{"<tool_call>\n", "\n</tool_call>", "\n"};
  JsonAutomaton one(tool_call_grammar(tools, hermes, false));
  JsonAutomaton many(tool_call_grammar(tools, hermes, true));
  const std::string w = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ";
  const std::string a = w + "{\"city\": \"Oslo\", \"days\":3}}\n</tool_call>";
  const std::string b = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  for (const std::string& t : {a, b, w + "{\"city\":\"x\"}}\n</tool_call>"}) {
    EXPECT_TRUE(one.matches(t)) << t;
    EXPECT_TRUE(many.matches(t)) << t;
  }
  EXPECT_TRUE(many.matches(a + "\n" + b));
  EXPECT_TRUE(many.matches(b + "\n" + a + "\n" + b));
  EXPECT_FALSE(one.matches(a + "\n" + b));
  for (const std::string& t : std::vector<std::string>{
           w + "{\"days\": 3}}\n</tool_call>",                // city is required
           w + "{\"city\": 1}}\n</tool_call>",                // city is a string
           w + "{\"city\": \"x\", \"z\": 1}}\n</tool_call>",  // no other keys
           std::string("<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"),
           std::string("<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>"),
           a.substr(0, a.size() - 1), a + "\n", a + b,
           std::string("{\"name\": \"now\", \"arguments\": {}}")}) {
    EXPECT_FALSE(one.matches(t)) << t;
    EXPECT_FALSE(many.matches(t)) << t;
  }
  // Llama 3's bare object with "parameters"; a number as the last argument ends at the '}'.
  JsonAutomaton llama(
      tool_call_grammar({{"f", args(R"({"type":"object","properties":{"n":{"type":"number"}}})")}},
                        ToolCallSyntax{"", "", "", "parameters"}, true));
  EXPECT_TRUE(llama.matches("{\"name\": \"f\", \"parameters\": {\"n\": -1.5}}"));
  EXPECT_FALSE(llama.matches("{\"name\": \"f\", \"arguments\": {\"n\": -1.5}}"));
  EXPECT_THROW(tool_call_grammar({}, hermes, false), Error);
  JsonAutomaton closed(after_text("</think>\n\n", args(R"({"enum": [1, "a"]})")));
  EXPECT_TRUE(closed.matches("</think>\n\n\"a\""));
  EXPECT_TRUE(closed.matches("</think>\n\n1"));  // a number may end the text
  EXPECT_FALSE(closed.matches("\"a\""));
  EXPECT_FALSE(closed.matches("</think>\n\n2"));
}

void expect_error(const std::string& schema, const std::string& needle) {
  try {
    compile_schema(json::parse(schema));
    ADD_FAILURE() << "no error for " << schema;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[json-schema]"), std::string::npos) << e.what();
  }
}

TEST(JsonSchema, BadSchemasNameTheProblem) {
  expect_error(R"({"type":"string","pattern":"^a"})", "unsupported keyword 'pattern' at #");
  expect_error(R"({"type":"object","properties":{"d":{"type":"string","format":"date"}}})",
               "'format' at #/properties/d");
  expect_error(R"({"type":"integer","minimum":3})", "'minimum'");
  expect_error(R"({"oneOf":[{"type":"string"}]})", "'oneOf'");
  expect_error(R"({"type":"strin"})", "unknown type 'strin'");
  expect_error(R"({"enum":[]})", "enum at # must be a non-empty array");
  expect_error(R"({"$ref":"#/$defs/nope"})", "$ref '#/$defs/nope'");
  expect_error(R"({"type":"object","properties":{"a":{}},"additionalProperties":true})",
               "additionalProperties");
  expect_error(R"({"type":"object","properties":{"a":{}},"required":["b"]})",
               "required property 'b'");
  expect_error(R"({"type":"string","maxLength":-1})", "maxLength at # must be a non-negative");
  expect_error(R"(false)", "no value can match");
  expect_error(R"({"type":"array","items":[{"type":"string"}]})", "tuple validation");
}

// The trie walk and the mask cache give exactly the tokens whose bytes the automaton accepts.
TEST(JsonSchema, TokenMaskIsExactAlongRandomWalks) {
  Tokenizer tok = Tokenizer::from_dir(test::data_path("embed/qwen3_embed_bf16"));
  auto table = TokenTable::build(tok);
  const int eos = *tok.token_to_id("<|endoftext|>");
  json cases = read_json_file(test::data_path("json_schema/cases.json"));
  std::mt19937 rng(7);
  for (const auto& c : cases) {
    const Grammar g = compile_schema(c.at("schema"));
    const JsonAutomaton a(g);
    for (int walk = 0; walk < 3; ++walk) {
      JsonConstraint con(table, g, {eos});
      State s = a.initial();
      std::string text;
      for (int step = 0; step < 60 && !con.complete(); ++step) {
        const std::vector<uint8_t> mask = con.allowed();
        std::vector<int> ok;
        for (size_t id = 0; id < mask.size(); ++id) {
          const bool want = static_cast<int>(id) == eos
                                ? a.accepting(s)
                                : !table->bytes[id].empty() && !a.feed(s, table->bytes[id]).dead();
          ASSERT_EQ(mask[id] != 0, want) << c["name"] << " after '" << text << "' token " << id;
          if (want && static_cast<int>(id) != eos) ok.push_back(static_cast<int>(id));
        }
        ASSERT_FALSE(ok.empty() && !a.accepting(s)) << c["name"] << " dead end at " << text;
        if (ok.empty()) break;
        const int t = ok[rng() % ok.size()];
        con.accept(t);
        s = a.feed(s, table->bytes[t]);
        text += table->bytes[t];
      }
      if (con.complete()) {
        EXPECT_TRUE(a.matches(text)) << text;
        con.accept(eos);
        const auto& after = con.allowed();
        EXPECT_EQ(std::count(after.begin(), after.end(), 1), 1) << "only EOS after the end";
      }
    }
  }
}

}  // namespace
}  // namespace lmx
