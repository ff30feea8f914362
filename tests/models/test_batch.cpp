// Continuous batching (lmx::Scheduler): in tier L1 every row of a batch produces exactly the
// tokens it produces alone (LanguageModel::generate), for each architecture and cache type of the
// tiny-model table, with rows of different prompt lengths joining and leaving mid-stream, seeded
// sampling and logits processors per row. Plus the scheduler's own behaviour: the queue limit,
// cancellation, a failing row beside healthy ones, the prompt cache.
#include <gtest/gtest.h>
#include <mlx/graph_utils.h>

#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "cache/rows_cache.h"
#include "core/error.h"
#include "core/json.h"
#include "engine/model_impl.h"
#include "generate/generate.h"
#include "io/safetensors.h"
#include "kernels/cuda/qmm.h"
#include "kernels/cuda/routing.h"
#include "kernels/cuda/rows_attention.h"
#include "lmx/lmx.h"
#include "test_util.h"

namespace lmx {
namespace {

namespace fs = std::filesystem;
namespace mx = mlx::core;

// This process's scratch directory, removed at exit.
const fs::path& scratch() {
  static const struct Root {
    fs::path path = fs::temp_directory_path() / ("lmx_batch_" + std::to_string(getpid()));
    ~Root() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } root;
  return root.path;
}

// A test-data model (a parity row's, by default) with the default model's tokenizer beside it
// (the tiny vocabularies are ids of SmolLM2's), so that LanguageModel can load it: a directory
// of links.
fs::path model_dir(const std::string& row, const std::string& table = "parity") {
  const fs::path src = fs::absolute(test::data_path(table + "/" + row));
  const fs::path tok = fs::absolute(test::data_path("smollm2-135m-instruct-4bit"));
  const fs::path dir = scratch() / row;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(src)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("reference") || name == "adapter") continue;
    fs::create_symlink(e.path(), dir / name);
  }
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"})
    fs::create_symlink(tok / name, dir / name);
  return dir;
}

int row_vocab(const fs::path& dir) {
  const json c = read_json_file(dir / "config.json");
  if (c.contains("vocab_size")) return c["vocab_size"].get<int>();
  return c["text_config"]["vocab_size"].get<int>();
}

struct Case {
  std::vector<int> prompt;
  GenerateOptions options;
};

// Four requests of different lengths; the caller's tweak sets sampling / processors per case.
std::vector<Case> make_cases(int vocab, int prefill_step, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  const int lengths[] = {5, 19, 11, 27};  // within the 32-token context of some rows
  const int max_tokens[] = {14, 6, 20, 9};
  std::vector<Case> cases;
  for (int i = 0; i < 4; ++i) {
    Case c;
    for (int j = 0; j < lengths[i]; ++j) c.prompt.push_back(id(rng));
    c.options.max_tokens = max_tokens[i];
    c.options.ignore_eos = true;  // random weights: full-length rows
    c.options.prefill_step_size = prefill_step;
    cases.push_back(std::move(c));
  }
  return cases;
}

// Greedy or sampled tokens and the log-probability of each, bits compared.
struct Tokens {
  std::vector<int> ids;
  std::vector<float> logprobs;
  bool operator==(const Tokens&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Tokens& t) {
  for (size_t i = 0; i < t.ids.size(); ++i) os << t.ids[i] << ":" << t.logprobs[i] << " ";
  return os;
}

// The single-stream token loop (what LanguageModel::generate runs), with its log-probabilities.
Tokens alone(LanguageModel& model, const Case& c) {
  GenerateOptions opt = c.options;
  if (!opt.kv_config) opt.kv_config = model.kv_config();
  Tokens out;
  const std::vector<int> eos = opt.ignore_eos ? std::vector<int>{} : model.eos_token_ids();
  generate(*model.impl().loaded.model, c.prompt, opt, eos, [&](const Step& s) {
    out.ids.push_back(s.token);
    out.logprobs.push_back(
        mx::astype(mx::take(s.logprobs, mx::array(s.token)), mx::float32).item<float>());
    return true;
  });
  return out;
}

struct Outcome {
  Tokens tokens;
  StreamResult result;
};

// Submits every case at once and waits for all of them.
std::vector<Outcome> batched(Scheduler& s, const std::vector<Case>& cases) {
  std::vector<Outcome> out(cases.size());
  std::vector<std::promise<void>> done(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    StreamRequest r;
    r.prompt = cases[i].prompt;
    r.options = cases[i].options;
    r.top_logprobs = 0;
    r.on_token = [&out, i](const StreamToken& t) {
      if (t.token >= 0) {
        out[i].tokens.ids.push_back(t.token);
        out[i].tokens.logprobs.push_back(t.logprob);
      }
      return true;
    };
    r.on_done = [&out, &done, i](const StreamResult& res) {
      out[i].result = res;
      done[i].set_value();
    };
    s.submit(std::move(r));
  }
  for (auto& d : done) d.get_future().wait();
  return out;
}

// One row of the table per architecture and cache type: plain, rotating (sliding window; the
// window wraps in decode), quantized, rotating-quantized, per-layer kv_config; RoPE variants;
// quantized weights; gemma4 (KV sharing), gemma2 (soft-capped scores over the raw keys) and
// qwen3_next / qwen3_5 (linear-attention state in an ArraysCache), whose rows step one at a time.
const std::vector<std::string> kRows = {
    "llama_tied",
    "llama_rope_yarn",
    "llama_rope_dynamic",
    "qwen2_untied",
    "qwen3_q4_g64",
    "llama_f16",
    "llama_f32_q4_g64",
    "gemma3_text_window8",
    "gemma3_text_q4_g64",
    "gemma3_tied",
    "gemma4_text_ple",
    "gemma4_moe_f32",
    "minicpm",
    "starcoder2_untied_q4_g64",
    "llama_kv4_g64",
    "llama_kv8_g64_start20",
    "gemma3_text_kv4_g32",
    "gemma3_text_kv_config",
    "qwen3_q4_kv4_g32",
    "phi3_longrope",
    "olmo2_q4_g64",
    "granite",
    "smollm3",
    "glm4",
    "qwen3_moe_f32",
    "gemma2_q4_g64",
    "llama_layer_types_window8",
    "gpt_oss_f32",
    "qwen3_next_f32",
    "qwen3_next_kv8_g32",
    "qwen3_5_moe_q4_g64",
};

class BatchRows : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchRows, EveryRowAsAloneWithJoinsAndLeaves) {
  const fs::path dir = model_dir(GetParam());
  LanguageModel model = LanguageModel::load(dir, {.exact = true});
  std::vector<Case> cases = make_cases(row_vocab(dir), 8, 7);
  // Case 1 samples with its own seed, case 2 runs logits processors: per-row settings.
  cases[1].options.sampler.temp = 0.9f;
  cases[1].options.seed = 1234;
  cases[2].options.processors.repetition_penalty = 1.3f;
  cases[2].options.processors.logit_bias = {{3, -2.5f}, {5, 1.5f}};
  // The row's KV quantization (a model's kv_config.json is read by LanguageModel::load).
  const json ref = read_json_file(test::data_path("parity/" + GetParam()) / "reference.json");
  if (ref.contains("kv_cache") && !ref["kv_cache"].is_null())
    for (auto& c : cases) {
      c.options.kv_bits = ref["kv_cache"]["bits"].get<int>();
      c.options.kv_group_size = ref["kv_cache"]["group_size"].get<int>();
      c.options.quantized_kv_start = ref["kv_cache"]["start"].get<int>();
    }
  std::vector<Tokens> want;
  for (const Case& c : cases) want.push_back(alone(model, c));

  // Three rows for four requests: the fourth joins when the first leaves.
  Scheduler s(model, {.max_batch = 3, .prefill_step_size = 8, .prompt_cache_entries = 0});
  const std::vector<Outcome> got = batched(s, cases);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(got[i].result.finish_reason, "length") << got[i].result.error;
    EXPECT_EQ(got[i].tokens, want[i]) << GetParam() << " request " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, BatchRows, ::testing::ValuesIn(kRows),
                         [](const auto& info) { return info.param; });

// The L3 gate of batched rows against their single-stream tokens: each row's greedy tokens agree
// up to its first divergence for at least 90% of all tokens, and each agreeing token's
// log-probability is within 1e-2.
void expect_within_gate(const std::vector<Outcome>& got, const std::vector<Tokens>& want,
                        const std::string& row) {
  int same = 0, total = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].result.finish_reason, "length") << got[i].result.error;
    ASSERT_EQ(got[i].tokens.ids.size(), want[i].ids.size());
    for (size_t j = 0; j < want[i].ids.size(); ++j) {
      ++total;
      if (got[i].tokens.ids[j] != want[i].ids[j]) break;  // the rest follows another path
      ++same;
      EXPECT_NEAR(got[i].tokens.logprobs[j], want[i].logprobs[j], 1e-2)
          << row << " request " << i << " token " << j;
    }
  }
  EXPECT_GE(same, total * 9 / 10) << row << ": " << same << " of " << total;
}

// Tier L3 (the CPU default): alone a row runs the fused layer (one primitive); in a batch the
// layers run its pieces, norm + Q/K/V + RoPE at each row's own position and out_proj + MLP,
// with the rows attention kernel between them, the same arithmetic in the same order, so llama
// rows equal their tokens and log-probabilities alone exactly. gemma3's sliding-window layers
// attend through MLX per row over their rotating caches in a batch (other rounding):
// expect_within_gate.
class BatchRowsL3 : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchRowsL3, RowsAgreeWithAloneWithinTheGate) {
  const fs::path dir = model_dir(GetParam());
  LanguageModel model = LanguageModel::load(dir);
  ASSERT_NE(model.tier().find("L3"), std::string::npos) << model.tier();
  std::vector<Case> cases = make_cases(row_vocab(dir), 8, 21);
  std::vector<Tokens> want;
  for (const Case& c : cases) want.push_back(alone(model, c));
  Scheduler s(model, {.max_batch = 3, .prefill_step_size = 8, .prompt_cache_entries = 0});
  const std::vector<Outcome> got = batched(s, cases);
  if (GetParam().rfind("gemma3", 0) == 0) return expect_within_gate(got, want, GetParam());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].result.finish_reason, "length") << got[i].result.error;
    EXPECT_EQ(got[i].tokens.ids, want[i].ids) << GetParam() << " request " << i;
    EXPECT_EQ(got[i].tokens.logprobs, want[i].logprobs) << GetParam() << " request " << i;
  }
}

// A batched decode step at tier L3 holds the fused pieces (one norm + Q/K/V + RoPE primitive per
// layer, at the rows' own positions), not MLX's RoPE: on the CPU MLX's rope is its fallback of
// ops (Cos, Sin, ...), which the same step at tier L1 shows.
TEST(BatchRowsL3Graph, BatchedStepRunsTheFusedPieces) {
  // The graph of one decode step of two rows at different positions, each on its own cache.
  const auto step_graph = [](Model& m) {
    Cache a = m.make_cache(), b = m.make_cache();
    mx::eval(m(mx::array({1, 2, 3}, {1, 3}), a));
    mx::eval(m(mx::array({4, 5, 6, 7, 8}, {1, 5}), b));
    std::vector<Cache*> rows = {&a, &b};
    Cache view = rows_view(rows, m.cpu_kernels());
    std::ostringstream dot;
    mx::export_to_dot(dot, {m(mx::array({9, 10}, {2, 1}), view)});
    return dot.str();
  };
  const auto count = [](const std::string& text, const std::string& label) {
    const std::string needle = "label =\"" + label + "\"";
    int n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
      ++n;
    return n;
  };
  for (const char* row : {"llama_f32_q4_g64", "gemma3_text_f32_q4_g64"}) {
    LanguageModel fast = LanguageModel::load(model_dir(row));
    LanguageModel exact = LanguageModel::load(model_dir(row), {.exact = true});
    Model& m = *fast.impl().loaded.model;
    const std::string l3 = step_graph(m), l1 = step_graph(*exact.impl().loaded.model);
    EXPECT_EQ(count(l3, "LmxNormQkvRope"), m.num_layers()) << row;
    EXPECT_GT(count(l1, "Cos"), 0) << row << ": tier L1's batched step rotates through MLX";
    EXPECT_EQ(count(l3, "Cos"), 0) << row << ": MLX's RoPE in the L3 batched step";
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, BatchRowsL3,
                         ::testing::Values("llama_f32_q4_g64", "qwen3_f32_q8_g64",
                                           "llama_f32_q4_rope_traditional",
                                           "gemma3_text_f32_q4_g64"),
                         [](const auto& info) { return info.param; });

// Tier L3 on the GPU (a CUDA build's default): batched decode steps run lmx's CUDA rows attention
// kernel (kernels/cuda/rows_attention.h) over the rows' caches, a row alone runs MLX's attention;
// the gate of BatchRowsL3. The rows are widths MLX's CUDA kernels take (`_a512_`, head_dim 64);
// gemma3's sliding-window layers (rotating caches) keep the per-row path beside the kernel's
// global layers. Tier L1 (--exact) never takes the kernel and stays exactly as alone. Without a
// CUDA build on a GPU (CI) these skip, saying so.
class BatchRowsGpuL3 : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchRowsGpuL3, RowsAgreeWithAloneWithinTheGate) {
  if (!kernels::cuda::available())
    GTEST_SKIP() << "needs a CUDA build running on a GPU (the CUDA rows attention kernel); this "
                    "build or machine has none";
  if (!kernels::cuda::rows_routed())
    GTEST_SKIP() << "the CUDA rows kernel is routed only with LMX_CUDA_ROWS=1 (opt-in until it "
                    "is measured faster); run with it";
  const fs::path dir = model_dir(GetParam());
  LanguageModel model = LanguageModel::load(dir);
  ASSERT_NE(model.tier().find("L3"), std::string::npos) << model.tier();
  std::vector<Case> cases = make_cases(row_vocab(dir), 8, 33);
  std::vector<Tokens> want;
  for (const Case& c : cases) want.push_back(alone(model, c));
  const long long before = kernels::cuda::rows_attention_calls();
  Scheduler s(model, {.max_batch = 3, .prefill_step_size = 8, .prompt_cache_entries = 0});
  const std::vector<Outcome> got = batched(s, cases);
  EXPECT_GT(kernels::cuda::rows_attention_calls(), before)
      << "no batched decode step took the CUDA rows kernel";
  expect_within_gate(got, want, GetParam());
}

TEST_P(BatchRowsGpuL3, ExactTierKeepsPerRowOpsAndTokens) {
  if (!kernels::cuda::available())
    GTEST_SKIP() << "needs a CUDA build running on a GPU (the CUDA rows attention kernel); this "
                    "build or machine has none";
  const fs::path dir = model_dir(GetParam());
  LanguageModel model = LanguageModel::load(dir, {.exact = true});
  std::vector<Case> cases = make_cases(row_vocab(dir), 8, 34);
  std::vector<Tokens> want;
  for (const Case& c : cases) want.push_back(alone(model, c));
  const long long before = kernels::cuda::rows_attention_calls();
  Scheduler s(model, {.max_batch = 3, .prefill_step_size = 8, .prompt_cache_entries = 0});
  const std::vector<Outcome> got = batched(s, cases);
  EXPECT_EQ(kernels::cuda::rows_attention_calls(), before) << "tier L1 took the CUDA rows kernel";
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(got[i].result.finish_reason, "length") << got[i].result.error;
    EXPECT_EQ(got[i].tokens, want[i]) << GetParam() << " request " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, BatchRowsGpuL3,
                         ::testing::Values("llama_a512_q4_g64", "qwen3_a512_q4_g64",
                                           "gemma3_text_a512_q4_g64"),
                         [](const auto& info) { return info.param; });

// Holds the scheduler's thread inside run() until released, so that the queue stands still.
class Stall {
 public:
  explicit Stall(Scheduler& s) {
    thread_ = std::thread([&s, this] {
      s.run([this] {
        entered_.set_value();
        release_.get_future().wait();
      });
    });
    entered_.get_future().wait();
  }
  void release() {
    if (thread_.joinable()) {
      release_.set_value();
      thread_.join();
    }
  }
  ~Stall() { release(); }

 private:
  std::promise<void> entered_, release_;
  std::thread thread_;
};

StreamRequest request(std::vector<int> prompt, int max_tokens, std::promise<StreamResult>& done,
                      std::vector<int>* tokens = nullptr) {
  StreamRequest r;
  r.prompt = std::move(prompt);
  r.options.max_tokens = max_tokens;
  r.options.ignore_eos = true;
  r.on_token = [tokens](const StreamToken& t) {
    if (tokens && t.token >= 0) tokens->push_back(t.token);
    return true;
  };
  r.on_done = [&done](const StreamResult& res) { done.set_value(res); };
  return r;
}

TEST(Scheduler, QueueLimitRefusesAndCancelledRequestsEnd) {
  LanguageModel model = LanguageModel::load(model_dir("llama_tied"), {.exact = true});
  Scheduler s(model, {.max_batch = 1, .max_queue = 2});
  std::promise<StreamResult> a, b, c;
  {
    Stall stall(s);
    s.submit(request({1, 2, 3}, 4, a));
    const uint64_t id_b = s.submit(request({4, 5, 6}, 4, b));
    EXPECT_EQ(s.waiting(), 2);
    EXPECT_THROW(s.submit(request({7, 8}, 4, c)), QueueFullError);
    s.cancel(id_b);  // still queued
  }
  EXPECT_EQ(a.get_future().get().finish_reason, "length");
  EXPECT_EQ(b.get_future().get().finish_reason, "cancelled");
  // Bad requests are refused at submit, naming the problem.
  std::promise<StreamResult> d;
  EXPECT_THROW(s.submit(request({}, 4, d)), Error);
  EXPECT_THROW(s.submit(request({100000}, 4, d)), Error);
}

TEST(Scheduler, CancelEndsARunningRowAndOthersGoOn) {
  const fs::path dir = model_dir("qwen3_tied");
  LanguageModel model = LanguageModel::load(dir, {.exact = true});
  std::vector<Case> cases = make_cases(row_vocab(dir), 2048, 11);
  const std::vector<int> want = alone(model, cases[0]).ids;
  Scheduler s(model, {.max_batch = 4});
  std::promise<StreamResult> long_done, short_done;
  std::vector<int> short_tokens;
  std::atomic<int> seen{0};
  uint64_t long_id = 0;
  std::promise<uint64_t> id_known;
  std::shared_future<uint64_t> id_future = id_known.get_future().share();
  StreamRequest r = request(cases[1].prompt, 100000, long_done);
  r.on_token = [&](const StreamToken& t) {
    if (t.token >= 0 && ++seen == 3) s.cancel(id_future.get());
    return true;
  };
  long_id = s.submit(std::move(r));
  id_known.set_value(long_id);
  StreamRequest q =
      request(cases[0].prompt, cases[0].options.max_tokens, short_done, &short_tokens);
  q.options = cases[0].options;
  s.submit(std::move(q));
  const StreamResult lr = long_done.get_future().get();
  EXPECT_EQ(lr.finish_reason, "cancelled");
  EXPECT_LT(lr.stats.generation_tokens, 10);
  EXPECT_EQ(short_done.get_future().get().finish_reason, "length");
  EXPECT_EQ(short_tokens, want);
}

// Throws on the third token it is told of: a constraint dead end.
class FailingConstraint : public TokenConstraint {
 public:
  explicit FailingConstraint(int vocab) : allowed_(vocab, 1) {}
  const std::vector<uint8_t>& allowed() override { return allowed_; }
  void accept(int) override {
    if (++n_ == 3) throw Error("test", "dead end");
  }
  bool complete() const override { return false; }

 private:
  std::vector<uint8_t> allowed_;
  int n_ = 0;
};

TEST(Scheduler, AFailingRowEndsAloneAndTheOthersMatch) {
  const fs::path dir = model_dir("llama_q4_g64");
  LanguageModel model = LanguageModel::load(dir, {.exact = true});
  std::vector<Case> cases = make_cases(row_vocab(dir), 2048, 5);
  std::vector<Tokens> want;
  for (const Case& c : cases) want.push_back(alone(model, c));
  cases[3].options.constraint = std::make_shared<FailingConstraint>(row_vocab(dir));
  Scheduler s(model, {.max_batch = 4, .prompt_cache_entries = 0});
  const std::vector<Outcome> got = batched(s, cases);
  EXPECT_EQ(got[3].result.finish_reason, "error");
  EXPECT_NE(got[3].result.error.find("dead end"), std::string::npos) << got[3].result.error;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i].result.finish_reason, "length") << got[i].result.error;
    EXPECT_EQ(got[i].tokens, want[i]) << "request " << i;
  }
}

TEST(Scheduler, PromptCacheReusesAllButTheLastTokenWithTheSameTokens) {
  const fs::path dir = model_dir("gemma3_text_window8");
  LanguageModel model = LanguageModel::load(dir, {.exact = true});
  std::vector<Case> cases = make_cases(row_vocab(dir), 8, 3);
  // Short enough that the sliding window has not wrapped: the cache can be trimmed.
  Case c = cases[0];
  c.options.max_tokens = 2;
  const Tokens want = alone(model, c);
  Scheduler s(model, {.max_batch = 2, .prefill_step_size = 8});
  const Outcome first = batched(s, {c})[0];
  const Outcome second = batched(s, {c})[0];
  EXPECT_EQ(first.result.cached_tokens, 0u);
  EXPECT_EQ(second.result.cached_tokens, c.prompt.size() - 1);
  EXPECT_EQ(first.tokens, want);
  EXPECT_EQ(second.tokens, want);
}

// mlx-lm's batch_generate (its left-padded BatchKVCache) on the default SmolLM2 model, greedy,
// all prompts at once (scripts/gen_batch_golden.py): the scheduler's rows give its tokens.
TEST(Scheduler, SameTokensAsMlxLmBatchGenerate) {
  const json ref = read_json_file(test::data_path("golden") / "batch_generate.json");
  LanguageModel model =
      LanguageModel::load(test::data_path("smollm2-135m-instruct-4bit"), {.exact = true});
  std::vector<Case> cases;
  for (const auto& c : ref["cases"]) {
    Case k;
    k.prompt = c["prompt_ids"].get<std::vector<int>>();
    k.options.max_tokens = ref["max_tokens"].get<int>();
    cases.push_back(std::move(k));
  }
  ASSERT_GE(cases.size(), 4u);
  Scheduler s(model, {.max_batch = static_cast<int>(cases.size()), .prompt_cache_entries = 0});
  const std::vector<Outcome> got = batched(s, cases);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto want = ref["cases"][i]["batch_tokens"].get<std::vector<int>>();
    EXPECT_EQ(got[i].tokens.ids, want) << "prompt " << i;
    EXPECT_EQ(got[i].result.finish_reason,
              static_cast<int>(want.size()) < cases[i].options.max_tokens ? "stop" : "length");
  }
}

// Speculative rows (GenerateOptions::speculative) run their own rounds beside the batched step:
// greedy, each gives the tokens it gives without speculation, for prompt lookup and for a draft
// model (the target itself: every proposal accepted), next to plain rows.
TEST(Scheduler, SpeculativeRowsBesideBatchedRowsGiveThePlainTokens) {
  const fs::path dir = model_dir("llama_q4_g64");
  LanguageModel model = LanguageModel::load(dir, {.exact = true});
  auto self = std::make_shared<LanguageModel>(LanguageModel::load(dir, {.exact = true}));
  std::vector<Case> cases = make_cases(row_vocab(dir), 8, 31);
  // A repeating prompt, so that prompt lookup finds earlier n-grams.
  std::vector<int> rep;
  for (int i = 0; i < 4; ++i) rep.insert(rep.end(), cases[0].prompt.begin(), cases[0].prompt.end());
  cases[0].prompt = rep;
  std::vector<Tokens> want;
  for (const Case& c : cases) want.push_back(alone(model, c));
  cases[0].options.prompt_lookup = 2;
  cases[0].options.num_draft_tokens = 4;
  cases[2].options.draft_model = self;
  cases[2].options.num_draft_tokens = 3;
  Scheduler s(model, {.max_batch = 4, .prefill_step_size = 8, .prompt_cache_entries = 0});
  const std::vector<Outcome> got = batched(s, cases);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(got[i].result.finish_reason, "length") << got[i].result.error;
    EXPECT_EQ(got[i].tokens.ids, want[i].ids) << "request " << i;
  }
  const SpeculativeStats& self_draft = got[2].result.stats.speculative;
  EXPECT_GT(self_draft.rounds, 0);
  EXPECT_EQ(self_draft.accepted, self_draft.drafted) << "a self-draft must be accepted whole";
  EXPECT_GT(self_draft.mean_accepted_length(), 1.0);
  EXPECT_GT(got[0].result.stats.speculative.rounds, 0);
  EXPECT_EQ(got[1].result.stats.speculative.rounds, 0);
  // A speculative row with logits processors is refused alone, naming the conflict.
  Case bad = cases[1];
  bad.options.prompt_lookup = 2;
  bad.options.processors.repetition_penalty = 1.2f;
  const Outcome refused = batched(s, {bad})[0];
  EXPECT_EQ(refused.result.finish_reason, "error");
  EXPECT_FALSE(refused.result.error.empty());
}

// LoRA adapters chosen per request (LanguageModel::load_adapter): rows with different adapters
// (and none) share one batch, and each row computes exactly what the model loaded with that
// adapter (LoadOptions::adapter_path) computes alone. The second adapter is the fixture's with
// lora_b negated.
// A copy of `adapter` in scratch()/name with every lora_b replaced by f(lora_b).
fs::path edited_adapter(const fs::path& adapter, const std::string& name,
                        const std::function<mx::array(const mx::array&)>& f) {
  const fs::path out = scratch() / name;
  fs::remove_all(out);
  fs::create_directories(out);
  fs::copy_file(adapter / "adapter_config.json", out / "adapter_config.json");
  Weights w = load_safetensors(adapter / "adapters.safetensors");
  for (auto& [key, a] : w)
    if (key.ends_with(".lora_b")) a = f(a);
  save_safetensors(out / "adapters.safetensors", w, {{"format", "mlx"}});
  return out;
}

fs::path negated_adapter(const fs::path& adapter, const std::string& name) {
  return edited_adapter(adapter, name, [](const mx::array& a) { return mx::negative(a); });
}

// A row whose logits hold NaN (its adapter's lora_b is NaN) ends with an error naming it, alone:
// the rows beside it in the batch give their tokens, and the single stream fails the same way.
TEST(Scheduler, ANonFiniteLogitEndsItsRowAlone) {
  const std::string row = "llama_lora_last1";
  const fs::path dir = model_dir(row, "lora");
  const fs::path a = test::data_path("lora/" + row) / "adapter";
  const fs::path nan_dir = edited_adapter(a, row + "_nan", [](const mx::array& v) {
    return mx::multiply(v, mx::array(std::nanf(""), v.dtype()));
  });
  LanguageModel base = LanguageModel::load(dir, {.exact = true});
  base.load_adapter("nan", nan_dir);
  std::vector<Case> cases = make_cases(row_vocab(dir), 8, 4);
  std::vector<Tokens> want;
  for (const Case& c : cases) want.push_back(alone(base, c));
  cases[1].options.adapter = "nan";
  GenerateOptions opt = cases[1].options;
  try {
    base.generate(cases[1].prompt, opt, [](const TokenOutput&) { return true; });
    ADD_FAILURE() << "generate with NaN logits did not fail";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
  }
  Scheduler s(base, {.max_batch = 4, .prompt_cache_entries = 0});
  const std::vector<Outcome> got = batched(s, cases);
  EXPECT_EQ(got[1].result.finish_reason, "error");
  EXPECT_NE(got[1].result.error.find("not finite"), std::string::npos) << got[1].result.error;
  EXPECT_TRUE(got[1].tokens.ids.empty());
  for (size_t i : {0, 2, 3}) {
    EXPECT_EQ(got[i].result.finish_reason, "length") << got[i].result.error;
    EXPECT_EQ(got[i].tokens, want[i]) << "request " << i;
  }
}

class BatchAdapters : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchAdapters, RowsWithDifferentAdaptersEachAsAloneWithThatAdapter) {
  const std::string row = GetParam();
  const fs::path dir = model_dir(row, "lora");
  const fs::path a = test::data_path("lora/" + row) / "adapter";
  const fs::path b = negated_adapter(a, row + "_negated");
  LanguageModel base = LanguageModel::load(dir, {.exact = true});
  base.load_adapter("a", a);
  base.load_adapter("b", b);
  ASSERT_EQ(base.adapters().size(), 2u);
  EXPECT_GT(base.adapters()[0].modules, 0);

  std::vector<Case> cases = make_cases(row_vocab(dir), 8, 17);
  cases.push_back(cases[0]);
  cases[4].prompt.push_back(cases[0].prompt.front());
  const char* pick[] = {"a", "b", "", "a", "b"};
  cases[1].options.sampler.temp = 0.8f;
  cases[1].options.seed = 99;
  std::vector<Tokens> want;
  {
    LanguageModel with_a = LanguageModel::load(dir, {.exact = true, .adapter_path = a});
    LanguageModel with_b = LanguageModel::load(dir, {.exact = true, .adapter_path = b});
    for (size_t i = 0; i < cases.size(); ++i) {
      const std::string p = pick[i];
      want.push_back(alone(p == "a" ? with_a : p == "b" ? with_b : base, cases[i]));
    }
  }
  for (size_t i = 0; i < cases.size(); ++i) cases[i].options.adapter = pick[i];
  // Single stream, the adapter by name.
  for (size_t i = 0; i < cases.size(); ++i) {
    Tokens got;
    GenerateOptions opt = cases[i].options;
    base.generate(cases[i].prompt, opt, [&](const TokenOutput& t) {
      if (t.token >= 0) got.ids.push_back(t.token);
      return true;
    });
    EXPECT_EQ(got.ids, want[i].ids) << row << " alone, request " << i;
  }
  // Four rows for five requests: a, b and none in one batch, the fifth joins later.
  Scheduler s(base, {.max_batch = 4, .prefill_step_size = 8, .prompt_cache_entries = 0});
  const std::vector<Outcome> got = batched(s, cases);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(got[i].result.finish_reason, "length") << got[i].result.error;
    EXPECT_EQ(got[i].tokens, want[i]) << row << " request " << i << " adapter '" << pick[i] << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, BatchAdapters,
                         ::testing::Values("llama_lora_last1", "llama_q4_lora_keys",
                                           "llama_untied_lora_head", "qwen3_lora_embed",
                                           "qwen2_lora_bias"),
                         [](const auto& info) { return info.param; });

// Tier L3: per-request adapters over the CPU kernels (a layer a routed adapter changes runs op by
// op) against the model loaded with the adapter, alone, in L3: the gate of BatchRowsL3.
TEST(SchedulerAdapters, L3RowsWithAdaptersAgreeWithTheLoadedAdapterWithinTheGate) {
  const std::string row = "llama_f32_q4_lora";
  const fs::path dir = model_dir(row, "lora");
  const fs::path a = test::data_path("lora/" + row) / "adapter";
  LanguageModel base = LanguageModel::load(dir);
  ASSERT_NE(base.tier().find("L3"), std::string::npos) << base.tier();
  base.load_adapter("a", a);
  std::vector<Case> cases = make_cases(row_vocab(dir), 8, 23);
  std::vector<Tokens> want;
  {
    LanguageModel with_a = LanguageModel::load(dir, {.adapter_path = a});
    for (size_t i = 0; i < cases.size(); ++i)
      want.push_back(alone(i % 2 == 0 ? with_a : base, cases[i]));
  }
  for (size_t i = 0; i < cases.size(); i += 2) cases[i].options.adapter = "a";
  Scheduler s(base, {.max_batch = 3, .prefill_step_size = 8, .prompt_cache_entries = 0});
  const std::vector<Outcome> got = batched(s, cases);
  expect_within_gate(got, want, row);
}

TEST(SchedulerAdapters, PromptCacheKeepsAdaptersApartAndUnloadWaitsForUsers) {
  const std::string row = "llama_lora_last1";
  const fs::path dir = model_dir(row, "lora");
  const fs::path a = test::data_path("lora/" + row) / "adapter";
  LanguageModel base = LanguageModel::load(dir, {.exact = true});
  base.load_adapter("a", a);
  std::vector<Case> cases = make_cases(row_vocab(dir), 8, 4);
  Case with_a = cases[0], plain = cases[0];
  with_a.options.adapter = "a";
  const Tokens want_plain = alone(base, plain);
  Scheduler s(base, {.max_batch = 2, .prefill_step_size = 8});
  const Outcome first = batched(s, {with_a})[0];
  // The same prompt without the adapter: the adapter's cache must not serve it.
  const Outcome second = batched(s, {plain})[0];
  EXPECT_EQ(second.result.cached_tokens, 0u);
  EXPECT_EQ(second.tokens, want_plain);
  EXPECT_NE(first.tokens, second.tokens);
  const Outcome third = batched(s, {with_a})[0];
  EXPECT_EQ(third.result.cached_tokens, with_a.prompt.size() - 1);
  EXPECT_EQ(third.tokens, first.tokens);

  // A running row holds its adapter: unloading it fails until the row ends.
  std::promise<StreamResult> done;
  std::promise<void> started;
  std::atomic<bool> once{false};
  StreamRequest r = request(cases[1].prompt, 100000, done);
  r.options.adapter = "a";
  uint64_t id = 0;
  r.on_token = [&](const StreamToken&) {
    if (!once.exchange(true)) started.set_value();
    return true;
  };
  id = s.submit(std::move(r));
  started.get_future().wait();
  try {
    s.run([&] { base.unload_adapter("a"); });
    ADD_FAILURE() << "unload of an adapter in use succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos) << e.what();
  }
  s.cancel(id);
  EXPECT_EQ(done.get_future().get().finish_reason, "cancelled");
  s.run([&] { base.unload_adapter("a"); });
  EXPECT_FALSE(base.has_adapter("a"));
  // Unknown adapters are refused at submit, naming the adapter.
  std::promise<StreamResult> d;
  StreamRequest bad = request({1, 2, 3}, 2, d);
  bad.options.adapter = "a";
  try {
    s.submit(std::move(bad));
    ADD_FAILURE() << "submit with an unknown adapter succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown adapter 'a'"), std::string::npos) << e.what();
  }
}

TEST(SchedulerAdapters, BadAdaptersAreRefusedNamingTheProblem) {
  const fs::path dir = model_dir("llama_dora", "lora");
  LanguageModel base = LanguageModel::load(dir, {.exact = true});
  auto message = [&](const std::string& name, const fs::path& path) {
    try {
      base.load_adapter(name, path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("d", test::data_path("lora/llama_dora") / "adapter").find("expected lora"),
            std::string::npos);
  EXPECT_NE(message("x", scratch() / "missing").find("does not exist"), std::string::npos);
  // An adapter made for another model: shapes named.
  EXPECT_NE(message("q", test::data_path("lora/qwen3_q8_lora") / "adapter").find("shape"),
            std::string::npos);
  EXPECT_TRUE(base.adapters().empty());
  // Expert (SwitchLinear) adapters are not routed per row: refused, pointing at --adapter-path.
  LanguageModel moe =
      LanguageModel::load(model_dir("gemma4_moe_f32_lora", "lora"), {.exact = true});
  try {
    moe.load_adapter("m", test::data_path("lora/gemma4_moe_f32_lora") / "adapter");
    ADD_FAILURE() << "an expert adapter loaded per request";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MoE expert layers"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(moe.adapters().empty());
}

}  // namespace
}  // namespace lmx
