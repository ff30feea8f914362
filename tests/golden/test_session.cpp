// lmx::Session on the real SmolLM2 checkpoint: a second turn that reuses the cached first turn
// must produce the greedy tokens a fresh LanguageModel::generate gives on the whole rendered
// conversation (itself bit-identical to mlx-lm, test_golden.cpp), prefilling only the new suffix.
#include <gtest/gtest.h>

#include "chat/chat_template.h"
#include "core/error.h"
#include "lmx/lmx.h"
#include "test_util.h"

namespace lmx {
namespace {

using chat::ojson;

struct Answer {
  std::vector<int> tokens;
  std::string text;
};

template <typename Gen>
Answer collect(Gen&& gen) {
  Answer a;
  gen([&](const TokenOutput& t) {
    if (t.token >= 0) a.tokens.push_back(t.token);
    a.text.append(t.text);
    return true;
  });
  return a;
}

TEST(Session, SecondTurnReusesCacheAndMatchesFreshGenerate) {
  const auto dir = test::data_path("smollm2-135m-instruct-4bit");
  LanguageModel model = LanguageModel::load(dir, {.exact = true});
  const chat::ChatTemplate tmpl = chat::ChatTemplate::from_model_dir(dir);
  GenerateOptions opt;
  opt.max_tokens = 16;
  Session session(model);

  ojson history = ojson::array({{{"role", "user"}, {"content", "What is the capital of France?"}}});
  const std::vector<int> p1 = model.encode(tmpl.render(history), false);
  const Answer s1 = collect([&](auto cb) { session.generate(p1, opt, cb); });
  const Answer f1 = collect([&](auto cb) { model.generate(p1, opt, cb); });
  EXPECT_EQ(session.reused_tokens(), 0);
  EXPECT_EQ(s1.tokens, f1.tokens);
  ASSERT_FALSE(s1.tokens.empty());
  EXPECT_GE(session.cached_tokens(), static_cast<int>(p1.size()));

  history.push_back({{"role", "assistant"}, {"content", s1.text}});
  history.push_back({{"role", "user"}, {"content", "And what is its most famous monument?"}});
  const std::vector<int> p2 = model.encode(tmpl.render(history), false);
  const Answer s2 = collect([&](auto cb) { session.generate(p2, opt, cb); });
  const Answer f2 = collect([&](auto cb) { model.generate(p2, opt, cb); });
  EXPECT_GE(session.reused_tokens(), static_cast<int>(p1.size()));
  EXPECT_LT(session.reused_tokens(), static_cast<int>(p2.size()));
  EXPECT_EQ(s2.tokens, f2.tokens) << "session: " << s2.text << "\nfresh:   " << f2.text;

  // The same prompt again reuses all but its last token and answers the same.
  const Answer s3 = collect([&](auto cb) { session.generate(p2, opt, cb); });
  EXPECT_EQ(session.reused_tokens(), static_cast<int>(p2.size()) - 1);
  EXPECT_EQ(s3.tokens, f2.tokens);

  // A shorter, diverging prompt trims the cache back to the common prefix.
  const Answer s4 = collect([&](auto cb) { session.generate(p1, opt, cb); });
  EXPECT_EQ(session.reused_tokens(), static_cast<int>(p1.size()) - 1);
  EXPECT_EQ(s4.tokens, f1.tokens);

  session.reset();
  EXPECT_EQ(session.cached_tokens(), 0);
  const Answer s5 = collect([&](auto cb) { session.generate(p2, opt, cb); });
  EXPECT_EQ(session.reused_tokens(), 0);
  EXPECT_EQ(s5.tokens, f2.tokens);

  EXPECT_THROW(session.generate({}, opt, [](const TokenOutput&) { return true; }), Error);
}

}  // namespace
}  // namespace lmx
