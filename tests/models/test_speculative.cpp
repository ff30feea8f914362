// Speculative decoding (src/generate/speculative.h) on the tiny target/draft pairs of
// scripts/gen_speculative.py: greedy output with speculation is token for token the output
// without it for every cache type (plain, quantized, rotating past its window, rotating
// quantized), for a draft model (agreeing in part, and the target itself) and for prompt lookup,
// in tier L1 and L3; equals mlx-lm's speculative_generate_step; the rejection-sampling step
// reproduces the target distribution exactly (enumerated) and in seeded draws (chi-square); bad
// input gives clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/json.h"
#include "generate/speculative.h"
#include "models/model.h"
#include "sampling/sampler.h"
#include "test_util.h"

namespace lmx {
namespace {

namespace fs = std::filesystem;

fs::path spec_dir(const std::string& rel) { return test::data_path("speculative/" + rel); }

std::vector<int> random_prompt(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, vocab - 1);
  std::vector<int> p(n);
  for (int& t : p) t = d(rng);
  return p;
}

// A prompt that repeats itself, so prompt lookup finds continuations.
std::vector<int> repetitive_prompt(int vocab, uint32_t seed) {
  std::vector<int> unit = random_prompt(7, vocab, seed), p;
  for (int i = 0; i < 4; ++i) p.insert(p.end(), unit.begin(), unit.end());
  p.resize(p.size() - 3);
  return p;
}

std::vector<int> plain_tokens(Model& m, const std::vector<int>& prompt, GenerateOptions o) {
  o.draft_model = nullptr;
  o.prompt_lookup = 0;
  std::vector<int> out;
  generate(m, prompt, o, {}, [&](const Step& s) {
    out.push_back(s.token);
    return true;
  });
  return out;
}

std::vector<int> spec_tokens(Model& m, Model* draft, const std::vector<int>& prompt,
                             const GenerateOptions& o, GenerationStats* stats = nullptr,
                             bool backoff = true) {
  Cache cache = m.make_cache();
  std::vector<int> out;
  Drafter drafter{draft, draft ? 0 : o.prompt_lookup};
  drafter.backoff = backoff;
  GenerationStats st =
      speculative_generate(m, cache, {}, prompt, o, drafter, {}, [&](const Step& s) {
        out.push_back(s.token);
        return true;
      });
  if (stats) *stats = st;
  return out;
}

// One greedy row: target and draft ("" = prompt lookup, "=" = the target itself).
struct Row {
  std::string name, target, draft;
  int k;
  int lookup = 0;
  std::optional<int> kv_bits = std::nullopt;
  bool exact = true;
  bool repetitive = false;
  int prompt_len = 30;
  enum Expect { partial, full, any } expect = partial;
};

std::ostream& operator<<(std::ostream& os, const Row& r) { return os << r.name; }

const std::vector<Row>& rows() {
  static const std::vector<Row> r = {
      {"llama_k1", "llama/target", "llama/draft", 1},
      {"llama_k3", "llama/target", "llama/draft", 3},
      {"llama_k5", "llama/target", "llama/draft", 5},
      {"llama_self_k4", "llama/target", "=", 4, 0, {}, true, false, 30, Row::full},
      {"llama_kv8", "llama/target", "llama/draft", 3, 0, 8},
      {"llama_kv4_self", "llama/target", "=", 3, 0, 4, true, false, 30, Row::full},
      {"llama_lookup3", "llama/target", "", 4, 3, {}, true, true, 25, Row::any},
      {"llama_lookup2_kv8", "llama/target", "", 3, 2, 8, true, true, 25, Row::any},
      // window 8 < prompt 30: every sliding layer's ring has wrapped before the first round.
      {"gemma3_k3", "gemma3/target", "gemma3/draft", 3, 0, {}, true, false, 30, Row::any},
      {"gemma3_self_k5", "gemma3/target", "=", 5, 0, {}, true, false, 30, Row::full},
      {"gemma3_short_self_k6", "gemma3/target", "=", 6, 0, {}, true, false, 3, Row::full},
      {"gemma3_kv4", "gemma3/target", "gemma3/draft", 3, 0, 4, true, false, 30, Row::any},
      {"gemma3_kv4_self", "gemma3/target", "=", 4, 0, 4, true, false, 30, Row::full},
      {"gemma3_lookup3", "gemma3/target", "", 4, 3, {}, true, true, 25, Row::any},
      // tier L3: a 4-bit target on lmx's CPU kernels.
      {"l3_q4_self", "../parity/llama_f32_q4_g64", "=", 3, 0, {}, false, false, 30, Row::full},
      {"l3_q4_draft",
       "../parity/llama_f32_q4_g64",
       "llama/draft",
       3,
       0,
       {},
       false,
       false,
       30,
       Row::any},
      {"l3_q4_lookup", "../parity/llama_f32_q4_g64", "", 3, 3, {}, false, true, 25, Row::any},
  };
  return r;
}

class SpeculativeGreedy : public ::testing::TestWithParam<Row> {};

TEST_P(SpeculativeGreedy, SameTokensAsPlainDecoding) {
  const Row& r = GetParam();
  LoadedWeights target = load_model(spec_dir(r.target), {.exact = r.exact});
  ASSERT_EQ(target.cpu_kernels, !r.exact);
  std::optional<LoadedWeights> draft;
  if (!r.draft.empty() && r.draft != "=") draft = load_model(spec_dir(r.draft), {.exact = r.exact});
  Model* d = r.draft == "=" ? target.model.get() : draft ? draft->model.get() : nullptr;
  const int vocab = target.info.config.at("vocab_size").get<int>();
  const std::vector<int> prompt =
      r.repetitive ? repetitive_prompt(vocab, 7) : random_prompt(r.prompt_len, vocab, 11);
  GenerateOptions o;
  o.max_tokens = 48;
  o.prefill_step_size = 8;
  o.num_draft_tokens = r.k;
  o.prompt_lookup = r.lookup;
  if (r.kv_bits) {
    o.kv_bits = r.kv_bits;
    o.kv_group_size = 32;
    o.quantized_kv_start = 0;
  }
  const std::vector<int> want = plain_tokens(*target.model, prompt, o);
  GenerationStats st;
  const std::vector<int> got = spec_tokens(*target.model, d, prompt, o, &st);
  EXPECT_EQ(got, want);
  const SpeculativeStats& s = st.speculative;
  EXPECT_GT(s.rounds, 0);
  EXPECT_LE(s.accepted, s.drafted);
  EXPECT_EQ(st.generation_tokens, o.max_tokens);
  // Every round emits its accepted proposals and one target token (the last may be cut).
  EXPECT_GE(s.accepted + s.rounds, o.max_tokens);
  EXPECT_LE(s.accepted + s.rounds, o.max_tokens + r.k + 1);
  if (r.expect == Row::partial) {
    EXPECT_GT(s.accepted, 0);
    EXPECT_LT(s.accepted, s.drafted);
  }
  if (r.expect == Row::full) {
    EXPECT_GE(s.acceptance_rate(), 0.9) << s.accepted << "/" << s.drafted;
  }
  if (r.lookup > 0) {
    EXPECT_GT(s.drafted, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, SpeculativeGreedy, ::testing::ValuesIn(rows()),
                         [](const auto& info) { return info.param.name; });

// mlx-lm's speculative_generate_step on the same weights (scripts/gen_speculative.py).
TEST(Speculative, MatchesMlxLmDraftModel) {
  json golden = read_json_file(spec_dir("golden.json"));
  ASSERT_GE(golden.at("rows").size(), 4u);
  for (const auto& row : golden.at("rows")) {
    const std::string pair = row.at("pair");
    LoadedWeights target = load_model(spec_dir(pair + "/target"), {.exact = true});
    LoadedWeights draft = load_model(spec_dir(pair + "/draft"), {.exact = true});
    GenerateOptions o;
    o.max_tokens = row.at("max_tokens");
    o.num_draft_tokens = row.at("num_draft_tokens");
    if (!row.at("kv_bits").is_null()) {
      o.kv_bits = row.at("kv_bits").get<int>();
      o.kv_group_size = row.at("kv_group_size");
      o.quantized_kv_start = row.at("quantized_kv_start");
    }
    const std::vector<int> prompt = row.at("prompt").get<std::vector<int>>();
    GenerationStats st;
    // mlx-lm drafts every round: its acceptance count is comparable without the back-off.
    const std::vector<int> got =
        spec_tokens(*target.model, draft.model.get(), prompt, o, &st, /*backoff=*/false);
    const std::string where = pair + " K=" + std::to_string(o.num_draft_tokens);
    EXPECT_EQ(got, row.at("tokens").get<std::vector<int>>()) << where;
    EXPECT_EQ(got, row.at("plain_tokens").get<std::vector<int>>()) << where;
    EXPECT_EQ(st.speculative.accepted, row.at("accepted").get<int>()) << where;
  }
}

// A draft of unrelated random weights (the same vocabulary) almost never agrees with the target.
// Drafting every round then costs K draft forwards and a K + 1 position verification per token;
// with the back-off the stream drafts a few rounds, then decodes plainly for growing pauses.
TEST(Speculative, BacksOffWhenNothingIsAccepted) {
  LoadedWeights target = load_model(spec_dir("llama/target"), {.exact = true});
  LoadedWeights draft = load_model(spec_dir("../parity/llama_untied"), {.exact = true});
  const std::vector<int> prompt = random_prompt(20, 256, 17);
  GenerateOptions o;
  o.max_tokens = 200;
  o.num_draft_tokens = 3;
  const std::vector<int> want = plain_tokens(*target.model, prompt, o);
  GenerationStats always, backed;
  const std::vector<int> a =
      spec_tokens(*target.model, draft.model.get(), prompt, o, &always, /*backoff=*/false);
  const std::vector<int> b = spec_tokens(*target.model, draft.model.get(), prompt, o, &backed);
  EXPECT_EQ(a, want);
  EXPECT_EQ(b, want);
  // The row is dry: without the back-off nearly every proposal is rejected.
  EXPECT_LT(always.speculative.acceptance_rate(), 0.1);
  EXPECT_GE(always.speculative.drafted, 3 * 150);
  // Two dry rounds, a pause of 16 plain tokens, one dry probe: the second back-off finds the
  // draft useless (under 1 in 10 kept) and drops it for the stream.
  std::printf("drafted %d (accepted %d) without the back-off, %d (accepted %d) with it\n",
              always.speculative.drafted, always.speculative.accepted, backed.speculative.drafted,
              backed.speculative.accepted);
  EXPECT_LE(backed.speculative.drafted, 3 * 3) << backed.speculative.drafted;
  EXPECT_GT(backed.speculative.drafted, 0);
  EXPECT_EQ(backed.generation_tokens, o.max_tokens);

  // Sampled: the back-off follows the counts only, so a seeded run repeats.
  o.sampler.temp = 0.8f;
  o.seed = 3;
  GenerationStats s1;
  const std::vector<int> c = spec_tokens(*target.model, draft.model.get(), prompt, o, &s1);
  EXPECT_EQ(c, spec_tokens(*target.model, draft.model.get(), prompt, o));
  EXPECT_EQ(c.size(), 200u);
  EXPECT_LE(s1.speculative.drafted, 3 * 2 * 6 + 3 * 8) << s1.speculative.drafted;
}

// The output distribution of one position, enumerated: the draft proposes d with q(d), keeps it
// with a(d), else draws from the residual r; the sum must be p.
std::vector<float> implied(const std::vector<float>& p, const std::vector<float>& q) {
  const int V = static_cast<int>(p.size());
  mx::array P(p.data(), {1, V}), Q(q.data(), {1, V});
  mx::array r = residual_distribution(P, Q);
  std::vector<float> out(V, 0.0f);
  for (int d = 0; d < V; ++d) {
    if (q[d] == 0) continue;
    mx::array a = acceptance_probability(P, Q, mx::array({d}));
    mx::eval(a, r);
    const float acc = a.item<float>();
    out[d] += q[d] * acc;
    for (int x = 0; x < V; ++x) out[x] += q[d] * (1 - acc) * r.data<float>()[x];
  }
  return out;
}

TEST(Speculative, RejectionStepIsExact) {
  const std::vector<std::pair<std::vector<float>, std::vector<float>>> cases = {
      {{0.1f, 0.2f, 0.3f, 0.4f}, {0.4f, 0.3f, 0.2f, 0.1f}},
      {{0.5f, 0.5f, 0.0f, 0.0f}, {0.0f, 0.1f, 0.2f, 0.7f}},
      {{0.25f, 0.25f, 0.25f, 0.25f}, {0.25f, 0.25f, 0.25f, 0.25f}},      // p == q
      {{0.7f, 0.1f, 0.1f, 0.1f, 0.0f}, {0.0f, 0.0f, 1.0f, 0.0f, 0.0f}},  // prompt lookup
      {{0.0f, 1.0f, 0.0f}, {0.6f, 0.3f, 0.1f}},                          // greedy target
      {{0.05f, 0.15f, 0.3f, 0.2f, 0.3f}, {0.3f, 0.3f, 0.1f, 0.2f, 0.1f}},
  };
  for (const auto& [p, q] : cases) {
    const std::vector<float> got = implied(p, q);
    for (size_t x = 0; x < p.size(); ++x) EXPECT_NEAR(got[x], p[x], 1e-6) << "token " << x;
  }
}

double chi_square(const std::vector<int>& counts, const std::vector<float>& p, int n) {
  double c = 0;
  for (size_t x = 0; x < p.size(); ++x) {
    const double e = n * p[x];
    c += (counts[x] - e) * (counts[x] - e) / e;
  }
  return c;
}

// N positions verified at once, each with its own seeded draft: the emitted token (the draft if
// kept, else the residual draw) must follow p; keeping every draft (following q) must not.
TEST(Speculative, RejectionSamplingStatistics) {
  const std::vector<float> p = {0.05f, 0.1f, 0.15f, 0.2f, 0.25f, 0.25f};
  const std::vector<float> q = {0.3f, 0.25f, 0.2f, 0.1f, 0.1f, 0.05f};
  const int V = 6, N = 20000;
  // 5 degrees of freedom: P(chi2 > 20.52) = 0.001.
  const double bound = 20.52;
  for (uint64_t seed : {1u, 2u, 3u}) {
    mx::random::seed(seed);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::discrete_distribution<int> draw(q.begin(), q.end());
    std::vector<int> drafts(N);
    for (int& d : drafts) d = draw(rng);
    std::vector<float> pr, qr;
    for (int i = 0; i <= N; ++i) pr.insert(pr.end(), p.begin(), p.end());
    for (int i = 0; i < N; ++i) qr.insert(qr.end(), q.begin(), q.end());
    mx::array P(pr.data(), {N + 1, V}), Q(qr.data(), {N, V});
    mx::array D(drafts.data(), {N}, mx::int32);
    SampledVerdict v = verify_sampled(P, Q, D);
    mx::array out =
        mx::astype(mx::where(v.accept, D, mx::astype(v.resampled, mx::int32)), mx::int32);
    mx::eval(out);
    std::vector<int> counts(V, 0), kept_all(V, 0);
    for (int i = 0; i < N; ++i) {
      counts[out.data<int32_t>()[i]]++;
      kept_all[drafts[i]]++;
    }
    EXPECT_LT(chi_square(counts, p, N), bound) << "seed " << seed;
    EXPECT_GT(chi_square(kept_all, p, N), bound) << "seed " << seed;
  }
}

// At temperature > 0 with the target as its own draft, p == q up to rounding: nearly every
// proposal is kept; a reproducible seed gives the same tokens twice.
TEST(Speculative, SampledSelfDraftAcceptsAlmostAll) {
  LoadedWeights target = load_model(spec_dir("llama/target"), {.exact = true});
  GenerateOptions o;
  o.max_tokens = 40;
  o.num_draft_tokens = 4;
  o.sampler.temp = 0.8f;
  o.seed = 5;
  const std::vector<int> prompt = random_prompt(12, 256, 3);
  GenerationStats st;
  const std::vector<int> a = spec_tokens(*target.model, target.model.get(), prompt, o, &st);
  const std::vector<int> b = spec_tokens(*target.model, target.model.get(), prompt, o);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 40u);
  EXPECT_GE(st.speculative.acceptance_rate(), 0.95);
}

// The sampled path with a partly agreeing draft and with prompt lookup (one-hot q) at top-p and
// top-k: seeded runs repeat, and some but not all proposals are kept.
TEST(Speculative, SampledDraftAndLookup) {
  LoadedWeights target = load_model(spec_dir("llama/target"), {.exact = true});
  LoadedWeights draft = load_model(spec_dir("llama/draft"), {.exact = true});
  for (int lookup : {0, 2}) {
    GenerateOptions o;
    o.max_tokens = 40;
    o.num_draft_tokens = 3;
    o.prompt_lookup = lookup;
    o.sampler.temp = 0.7f;
    o.sampler.top_p = 0.95f;
    o.sampler.top_k = 50;
    o.seed = 9;
    const std::vector<int> prompt = repetitive_prompt(256, 4);
    Model* d = lookup ? nullptr : draft.model.get();
    GenerationStats st;
    const std::vector<int> a = spec_tokens(*target.model, d, prompt, o, &st);
    EXPECT_EQ(a, spec_tokens(*target.model, d, prompt, o)) << "lookup " << lookup;
    EXPECT_EQ(a.size(), 40u);
    EXPECT_GT(st.speculative.accepted, 0) << "lookup " << lookup;
    EXPECT_LT(st.speculative.accepted, st.speculative.drafted) << "lookup " << lookup;
  }
}

TEST(Speculative, PromptLookupProposals) {
  EXPECT_EQ(prompt_lookup({1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3}, 3, 2), (std::vector<int>{4, 5}));
  EXPECT_EQ(prompt_lookup({1, 2, 3, 4, 2}, 3, 5), (std::vector<int>{3, 4, 2}));
  EXPECT_EQ(prompt_lookup({7, 8, 9}, 3, 4), std::vector<int>{});
  EXPECT_EQ(prompt_lookup({5, 5}, 2, 3), (std::vector<int>{5}));
  EXPECT_EQ(prompt_lookup({1, 2, 1, 2}, 1, 4), (std::vector<int>{1, 2}));
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const auto& s : parts)
      EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
  }
}

TEST(Speculative, BadInput) {
  LoadedWeights target = load_model(spec_dir("llama/target"), {.exact = true});
  LoadedWeights other = load_model(spec_dir("vocab320"), {.exact = true});
  const std::vector<int> prompt = random_prompt(8, 256, 1);
  GenerateOptions o;
  o.max_tokens = 8;
  expect_error([&] { spec_tokens(*target.model, other.model.get(), prompt, o); },
               {"[speculative]", "320", "256", "vocabulary"});
  o.num_draft_tokens = 0;
  expect_error([&] { spec_tokens(*target.model, target.model.get(), prompt, o); },
               {"[speculative]", "num_draft_tokens must be >= 1, got 0"});
  o.num_draft_tokens = 3;
  o.processors.repetition_penalty = 1.2f;
  expect_error([&] { spec_tokens(*target.model, target.model.get(), prompt, o); },
               {"[speculative]", "not supported"});
  o.processors = {};
  expect_error([&] { load_model(spec_dir("llama") / "missing_draft"); }, {"missing_draft"});
  const test::RunResult r =
      test::run_lmx("generate --model " + test::data_path("smollm2-135m-instruct-4bit").string() +
                    " --prompt hi --max-tokens 2 --draft-model /nonexistent/draft");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("/nonexistent/draft"), std::string::npos) << r.err;
  const test::RunResult k0 =
      test::run_lmx("generate --model " + test::data_path("smollm2-135m-instruct-4bit").string() +
                    " --prompt hi --max-tokens 2 --prompt-lookup 2 --num-draft-tokens 0");
  EXPECT_NE(k0.exit_code, 0);
  EXPECT_NE(k0.err.find("--num-draft-tokens must be >= 1, got 0"), std::string::npos) << k0.err;
}

}  // namespace
}  // namespace lmx
