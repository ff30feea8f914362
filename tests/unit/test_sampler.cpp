// The sampler and logits processors against mlx-lm's (scripts/gen_sampler_fixtures.py).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "sampling/sampler.h"
#include "test_util.h"

namespace lmx {
namespace {

struct Fixtures {
  Weights arrays;
  nlohmann::json meta;
  Fixtures() {
    arrays = load_safetensors(test::data_path("sampler/sampler.safetensors"));
    std::ifstream in(test::data_path("sampler/sampler.json"));
    meta = nlohmann::json::parse(in);
  }
  const mx::array& at(const std::string& k) const { return arrays.at(k); }
};

void expect_identical(const mx::array& got, const mx::array& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  // Bitwise equality, -inf included.
  EXPECT_TRUE(mx::array_equal(got, want, /*equal_nan=*/true).item<bool>()) << what;
}

TEST(Sampler, FiltersMatchMlxLm) {
  Fixtures f;
  for (const std::string d : {"float32", "bfloat16"}) {
    const mx::array& lp = f.at(d + ".logprobs");
    expect_identical(apply_top_p(lp, 0.9f), f.at(d + ".top_p"), d + " top_p");
    expect_identical(apply_min_p(lp, 0.05f, 1), f.at(d + ".min_p"), d + " min_p");
    expect_identical(apply_min_p(lp, 0.5f, 7), f.at(d + ".min_p_keep"), d + " min_p keep 7");
    expect_identical(apply_top_k(lp, 10), f.at(d + ".top_k"), d + " top_k");
  }
}

TEST(Sampler, SeededDrawsMatchMlxLm) {
  Fixtures f;
  for (const auto& c : f.meta["samplers"]) {
    SamplerOptions o;
    const auto& opt = c["options"];
    o.temp = opt.value("temp", 0.0f);
    o.top_p = opt.value("top_p", 0.0f);
    o.top_k = opt.value("top_k", 0);
    o.min_p = opt.value("min_p", 0.0f);
    o.min_tokens_to_keep = opt.value("min_tokens_to_keep", 1);
    const mx::array& lp = f.at(c["dtype"].get<std::string>() + ".logprobs");
    mx::random::seed(c["seed"].get<uint64_t>());
    std::vector<int> got;
    for (size_t i = 0; i < c["tokens"].size(); ++i) got.push_back(sample(lp, o).item<int>());
    EXPECT_EQ(got, c["tokens"].get<std::vector<int>>()) << c.dump();
  }
}

TEST(Sampler, LogitsProcessorsMatchMlxLm) {
  Fixtures f;
  for (const auto& c : f.meta["processors"]) {
    LogitsProcessorOptions o;
    const auto& opt = c["options"];
    if (opt.contains("repetition_penalty")) o.repetition_penalty = opt["repetition_penalty"];
    o.repetition_context_size = opt.value("repetition_context_size", 20);
    if (opt.contains("presence_penalty")) o.presence_penalty = opt["presence_penalty"];
    if (opt.contains("frequency_penalty")) o.frequency_penalty = opt["frequency_penalty"];
    o.frequency_context_size = opt.value("frequency_context_size", 20);
    if (opt.contains("logit_bias"))
      for (auto it = opt["logit_bias"].begin(); it != opt["logit_bias"].end(); ++it)
        o.logit_bias.emplace_back(std::stoi(it.key()), it->get<float>());
    const std::string d = c["dtype"].get<std::string>();
    auto h = c["history"].get<std::vector<int>>();
    mx::array history(h.data(), {static_cast<int>(h.size())}, mx::int32);
    expect_identical(process_logits(history, f.at(d + ".logits"), o),
                     f.at(d + ".processed_" + std::to_string(c["index"].get<int>())), c.dump());
  }
}

TEST(Sampler, InvalidOptionsNameTheField) {
  SamplerOptions o;
  o.top_p = 1.5f;
  EXPECT_THROW(validate(o, 100), Error);
  o = {};
  o.top_k = 100;
  try {
    validate(o, 100);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_k must be in [0, 100)"), std::string::npos);
  }
  o = {};
  o.temp = -1;
  EXPECT_THROW(validate(o, 100), Error);
}

}  // namespace
}  // namespace lmx
