// Chat templates against transformers' apply_chat_template: the prompts in
// $LMX_TEST_DATA/templates/cases.json (scripts/gen_template_fixtures.py) must be byte-identical.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "core/error.h"
#include "core/json.h"
#include "test_util.h"

namespace {

using lmx::chat::ChatTemplate;
using lmx::chat::ojson;
using lmx::chat::TemplateOptions;

const ojson& fixtures() {
  static const ojson j = [] {
    std::ifstream f(lmx::test::data_path("templates/cases.json"));
    std::stringstream ss;
    ss << f.rdbuf();
    ojson parsed = ojson::parse(ss.str());
    // The fixtures' strftime_now time (scripts/gen_template_fixtures.py).
    setenv("SOURCE_DATE_EPOCH",
           std::to_string(parsed.at("source_date_epoch").get<long long>()).c_str(), 1);
    return parsed;
  }();
  return j;
}

std::string first_difference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  std::ostringstream os;
  os << "first difference at byte " << i << " (want " << want.size() << " bytes, got " << got.size()
     << ")\n  want: " << ojson(want.substr(from, 100)).dump()
     << "\n  got:  " << ojson(got.substr(from, 100)).dump();
  return os.str();
}

// The '...' and "..." spans of a jinja2 / Python error message, except Python's own type names
// ('transformers...TemplateDict object'), which lmx's objects do not share.
std::vector<std::string> quoted_words(const std::string& msg) {
  std::vector<std::string> out;
  for (size_t i = 0; i < msg.size(); ++i) {
    const char q = msg[i];
    if (q != '\'' && q != '"') continue;
    const size_t j = msg.find(q, i + 1);
    if (j == std::string::npos) break;
    const std::string w = msg.substr(i + 1, j - i - 1);
    if (!w.empty() && !w.ends_with(" object")) out.push_back(w);
    i = j;
  }
  return out;
}

TemplateOptions options_of(const ojson& c) {
  TemplateOptions opt;
  opt.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
  if (c.contains("tools")) opt.tools = c["tools"];
  opt.kwargs = c.value("kwargs", ojson::object());
  return opt;
}

// Renders one case; returns "" when it matches transformers, else what went wrong.
std::string check_case(const ChatTemplate* tmpl, const std::string& compile_error, const ojson& c) {
  std::string got, error;
  if (tmpl) {
    try {
      got = tmpl->render(c.at("messages"), options_of(c));
    } catch (const lmx::Error& e) {
      error = e.what();
    }
  } else {
    error = compile_error;
  }
  if (c.contains("error")) {
    if (error.empty())
      return "transformers raised " + c["error_type"].get<std::string>() + " (" +
             c["error"].get<std::string>() + ") but lmx rendered " + ojson(got).dump();
    // raise_exception's message must reach the user.
    const std::string want = c["error"].get<std::string>();
    if (c["error_type"] == "TemplateError" && error.find(want) == std::string::npos)
      return "error text lost: want '" + want + "', got '" + error + "'";
    // Other errors name what jinja2 names: each quoted word of its message (a token, a filter, an
    // attribute, an operand type), or its whole text when nothing is quoted.
    if (c["error_type"] != "TemplateError" && error.find(want) == std::string::npos) {
      const std::vector<std::string> words = quoted_words(want);
      if (words.empty()) {
        // jinja2 quotes an object's type in some messages and not in others: compare unquoted.
        auto unquoted = [](std::string t) {
          std::erase_if(t, [](char ch) { return ch == '\'' || ch == '"'; });
          return t;
        };
        const std::string text =
            unquoted(want.ends_with('.') ? want.substr(0, want.size() - 1) : want);
        if (unquoted(error).find(text) == std::string::npos)
          return c["error_type"].get<std::string>() + " '" + want + "' but lmx said '" + error +
                 "'";
      }
      for (const std::string& w : words)
        if (error.find(w) == std::string::npos)
          return c["error_type"].get<std::string>() + " '" + want + "': lmx's '" + error +
                 "' does not name '" + w + "'";
    }
    return "";
  }
  if (!error.empty()) return "lmx failed: " + error;
  const std::string want = c.at("expected").get<std::string>();
  return got == want ? "" : first_difference(want, got);
}

// Runs every case whose template name starts with `prefix` (or none of the `others`).
void run_group(const std::string& prefix, bool exclude_prefixes) {
  const ojson& fx = fixtures();
  std::map<std::string, std::pair<std::unique_ptr<ChatTemplate>, std::string>> compiled;
  size_t n = 0, failed = 0;
  for (const auto& c : fx.at("cases")) {
    const std::string tname = c.at("template").get<std::string>();
    const bool is_feature = tname.rfind("feature/", 0) == 0,
               is_sweep = tname.rfind("sweep/", 0) == 0;
    const bool in_group = exclude_prefixes ? !is_feature && !is_sweep : tname.rfind(prefix, 0) == 0;
    if (!in_group) continue;
    auto it = compiled.find(tname);
    if (it == compiled.end()) {
      const ojson& t = fx.at("templates").at(tname);
      std::unique_ptr<ChatTemplate> tmpl;
      std::string err;
      try {
        tmpl = std::make_unique<ChatTemplate>(ChatTemplate::from_source(
            t.at("source").get<std::string>(), t.at("bos_token").get<std::string>(),
            t.at("eos_token").get<std::string>()));
      } catch (const lmx::Error& e) {
        err = e.what();
      }
      it = compiled.emplace(tname, std::make_pair(std::move(tmpl), err)).first;
    }
    ++n;
    const std::string problem = check_case(it->second.first.get(), it->second.second, c);
    if (!problem.empty()) {
      ++failed;
      ADD_FAILURE() << c.at("name").get<std::string>() << ": " << problem;
    }
  }
  EXPECT_GT(n, 0u) << "no cases in group " << prefix;
  std::printf("[chat templates] %s: %zu cases, %zu failed\n", prefix.c_str(), n, failed);
}

TEST(ChatTemplate, JinjaFeaturesMatchJinja2) { run_group("feature/", false); }

TEST(ChatTemplate, RealTemplatesMatchTransformers) { run_group("real", true); }

TEST(ChatTemplate, HubTemplateSweepMatchesTransformers) { run_group("sweep/", false); }

// tokenizer_config.json templates (plain and named), chat_template.jinja, AddedToken special
// tokens and --chat-template overrides against AutoTokenizer.from_pretrained(dir).
TEST(ChatTemplate, ModelDirMatchesAutoTokenizer) {
  size_t n = 0;
  for (const auto& c : fixtures().at("model_dir")) {
    const ChatTemplate t =
        lmx::chat::load_chat_template(c.at("dir").get<std::string>(), c.value("override", ""));
    const std::string problem = check_case(&t, "", c);
    EXPECT_EQ(problem, "") << c.at("name").get<std::string>();
    ++n;
  }
  EXPECT_GT(n, 0u);
}

TEST(ChatTemplate, ErrorsNameTheTemplateAndLine) {
  try {
    ChatTemplate::from_source("line one\n{% if true %}\n{{ x.y.z }}\n{% endif %}")
        .render(ojson::parse(R"([{"role": "user", "content": "hi"}])"), {});
    FAIL() << "expected an error";
  } catch (const lmx::Error& e) {
    EXPECT_NE(std::string(e.what()).find("line"), std::string::npos) << e.what();
  }
  try {
    ChatTemplate::from_source("ok\n\n{% for %}");
    FAIL() << "expected a syntax error";
  } catch (const lmx::Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ChatTemplate::from_model_dir(lmx::test::source_dir() / "docs"), lmx::Error);
  EXPECT_THROW(ChatTemplate::from_source("{{ messages }}").render(ojson::object(), {}), lmx::Error);
}

// SOURCE_DATE_EPOCH fixes strftime_now's time (UTC); a value that is not a number of seconds is
// an error naming it, not a silent fallback to the clock.
TEST(ChatTemplate, SourceDateEpochFixesStrftimeNow) {
  const char* before = std::getenv("SOURCE_DATE_EPOCH");
  const std::string saved = before ? before : "";
  const auto msgs = ojson::parse(R"([{"role": "user", "content": "hi"}])");
  const auto t = ChatTemplate::from_source("{{ strftime_now('%Y-%m-%d %H:%M:%S') }}");
  setenv("SOURCE_DATE_EPOCH", "86399", 1);
  EXPECT_EQ(t.render(msgs, {}), "1970-01-01 23:59:59");
  setenv("SOURCE_DATE_EPOCH", "1767323045", 1);
  EXPECT_EQ(t.render(msgs, {}), "2026-01-02 03:04:05");
  for (const char* bad : {"", "12x", "tomorrow", "99999999999999999999999"}) {
    setenv("SOURCE_DATE_EPOCH", bad, 1);
    try {
      t.render(msgs, {});
      ADD_FAILURE() << "expected an error for '" << bad << "'";
    } catch (const lmx::Error& e) {
      EXPECT_NE(std::string(e.what()).find("SOURCE_DATE_EPOCH"), std::string::npos) << e.what();
    }
  }
  if (before)
    setenv("SOURCE_DATE_EPOCH", saved.c_str(), 1);
  else
    unsetenv("SOURCE_DATE_EPOCH");
}

// Hostile templates and inputs get lmx::Error, never a crash, a hang or exhausted memory.
TEST(ChatTemplate, HostileInputGetsErrors) {
  const ojson msgs = ojson::parse(R"([{"role": "user", "content": "hi"}])");
  const auto renders = [&](const std::string& src) {
    return ChatTemplate::from_source(src).render(msgs, {});
  };
  EXPECT_THROW(renders("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}"),
               lmx::Error);
  EXPECT_THROW(renders("{{ " + std::string(100000, '-') + "1 }}"), lmx::Error);
  std::string nested_ifs;
  for (int k = 0; k < 5000; ++k) nested_ifs += "{% if true %}";
  EXPECT_THROW(renders(nested_ifs), lmx::Error);
  EXPECT_THROW(renders("{{ 'a' * 1000000000000 }}"), lmx::Error);
  EXPECT_THROW(renders("{% for i in range(1000000) %}{% endfor %}"), lmx::Error);
  EXPECT_THROW(renders("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), lmx::Error);
  EXPECT_THROW(renders("{{ 'unterminated }}"), lmx::Error);
  EXPECT_THROW(renders("{% include 'x.jinja' %}"), lmx::Error);
  EXPECT_THROW(renders("{{ 1 / 0 }}"), lmx::Error);
  EXPECT_THROW(renders("{{ 9223372036854775807 + 1 }}"), lmx::Error);  // no silent wrap
  EXPECT_THROW(renders("{{ 3 ** 64 }}"), lmx::Error);
  EXPECT_THROW(renders("{{ range(1e300) }}"), lmx::Error);
  EXPECT_THROW(renders("{{ '\\u12' }}"), lmx::Error);
  std::string deep = "[{\"role\": \"user\", \"content\": ";
  for (int k = 0; k < 2000; ++k) deep += "[";
  for (int k = 0; k < 2000; ++k) deep += "]";
  deep += "}]";
  EXPECT_THROW(ChatTemplate::from_source("{{ messages }}").render(ojson::parse(deep), {}),
               lmx::Error);
}

}  // namespace

namespace {

// lmx::json (keys sorted) converts to the ordered JSON render() takes: same prompt as the
// ordered input with its keys in sorted order.
TEST(ChatTemplate, AcceptsLmxJson) {
  const ChatTemplate t = ChatTemplate::from_source("{{ messages }}|{{ tools | tojson }}");
  const std::string msgs = R"([{"role": "user", "content": "hi", "extra": {"z": 1, "a": 2}}])";
  const std::string tools = R"([{"type": "function", "function": {"name": "f"}}])";
  TemplateOptions a, b;
  a.tools = lmx::json::parse(tools);
  b.tools = ojson::parse(tools);
  const std::string from_lmx = t.render(lmx::json::parse(msgs), a);
  const std::string sorted = t.render(ojson::parse(lmx::json::parse(msgs).dump()), b);
  EXPECT_EQ(from_lmx.substr(0, from_lmx.find('|')), sorted.substr(0, sorted.find('|')));
  EXPECT_NE(from_lmx, t.render(ojson::parse(msgs), b));  // the ordered input keeps its order
}

}  // namespace

namespace {

// Mutated real templates (truncated, cut, duplicated spans, stray delimiters) either render or
// fail with lmx::Error: no other exception, crash or hang. Deterministic (fixed seed).
TEST(ChatTemplate, MutatedTemplatesFailCleanly) {
  const ojson& fx = fixtures();
  std::vector<std::string> sources;
  for (const auto& [name, t] : fx.at("templates").items())
    sources.push_back(t.at("source").get<std::string>());
  ASSERT_FALSE(sources.empty());
  const ojson msgs = fx.at("cases").at(fx.at("cases").size() / 2).at("messages");
  TemplateOptions opt;
  opt.tools =
      ojson::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {}}}])");
  std::mt19937 rng(1234);
  size_t rendered = 0, errors = 0;
  for (int it = 0; it < 3000; ++it) {
    std::string s = sources[rng() % sources.size()];
    if (s.empty()) continue;
    const size_t a = rng() % s.size(), b = std::min(s.size(), a + rng() % 40);
    switch (rng() % 4) {
      case 0:
        s.resize(a);
        break;
      case 1:
        s.erase(a, b - a);
        break;
      case 2:
        s.insert(a, s.substr(a, b - a));
        break;
      default:
        s[a] = "{}%#-+|.()[]'\"\\~*/"[rng() % 19];
    }
    try {
      ChatTemplate::from_source(s, "<s>", "</s>").render(msgs, opt);
      ++rendered;
    } catch (const lmx::Error&) {
      ++errors;
    }
  }
  EXPECT_GT(rendered, 0u);
  EXPECT_GT(errors, 0u);
}

}  // namespace
