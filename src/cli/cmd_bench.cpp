#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/json.h"

namespace lmx::cli {

namespace {

// "P:G,P:G,...": prompt and generation lengths of each workload of one --workloads run.
std::vector<std::pair<int, int>> parse_workloads(const std::string& spec) {
  std::vector<std::pair<int, int>> out;
  size_t pos = 0;
  while (pos <= spec.size()) {
    const size_t end = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, end - pos);
    const size_t colon = item.find(':');
    int p = 0, g = 0;
    size_t used_p = 0, used_g = 0;
    try {
      if (colon != std::string::npos) {
        p = std::stoi(item.substr(0, colon), &used_p);
        g = std::stoi(item.substr(colon + 1), &used_g);
      }
    } catch (const std::exception&) {
      used_p = 0;
    }
    check(colon != std::string::npos && used_p == colon && used_g == item.size() - colon - 1 &&
              p > 0 && g > 0,
          "lmx bench", "--workloads expects PROMPT:GEN pairs of positive integers separated by ",
          "commas, got '", item, "'");
    out.emplace_back(p, g);
    pos = end + 1;
  }
  return out;
}

struct BenchResult {
  double prompt_tps = 0, generation_tps = 0;
  size_t peak = 0;
  GenerationStats last;
};

// Like mlx_lm.benchmark: a random prompt of prompt_tokens ids, then gen_tokens decode steps that
// ignore EOS; the mean over trials after one warm-up run.
// A non-empty `text_prompt` replaces the random ids (speculation needs text worth predicting).
BenchResult bench_one(LanguageModel& model, GenerateOptions opt, int prompt_tokens, int gen_tokens,
                      int trials, uint32_t seed, const std::vector<int>& text_prompt = {}) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, model.vocab_size() - 1);
  std::vector<int> prompt(prompt_tokens);
  for (int& t : prompt) t = dist(rng);
  if (!text_prompt.empty()) prompt = text_prompt;
  opt.max_tokens = gen_tokens;
  opt.ignore_eos = true;
  auto run = [&] { return model.generate(prompt, opt, [](const TokenOutput&) { return true; }); };
  run();  // warm-up
  BenchResult r;
  for (int i = 0; i < trials; ++i) {
    r.last = run();
    r.prompt_tps += r.last.prompt_tps();
    r.generation_tps += r.last.generation_tps();
    r.peak = std::max(r.peak, r.last.peak_memory);
  }
  r.prompt_tps /= trials;
  r.generation_tps /= trials;
  return r;
}

void print_result(const std::string& dir, const LanguageModel& model, const GenerateOptions& opt,
                  int p, int g, const BenchResult& r, bool as_json, int tp,
                  const std::string& adapter) {
  const auto& per_layer = opt.kv_config ? *opt.kv_config : model.kv_config();
  if (tensor_parallel_rank().value_or(0) != 0) return;
  if (as_json) {
    json j = {{"model", dir},
              {"adapter", adapter.empty() ? json() : json(adapter)},
              {"backend", backend_description()},
              {"tier", model.tier()},
              {"tensor_parallel", tp},
              {"prompt_tokens", p},
              {"gen_tokens", g},
              {"prompt_tps", r.prompt_tps},
              {"generation_tps", r.generation_tps},
              {"peak_memory_gb", r.peak / 1e9},
              {"kv_bits", opt.kv_bits ? json(*opt.kv_bits) : json()},
              {"kv_config_layers", per_layer.size()},
              {"kv_bytes", r.last.kv_bytes},
              {"kv_bytes_per_token", r.last.kv_bytes_per_token}};
    if (opt.speculative()) {
      const SpeculativeStats& s = r.last.speculative;
      j["speculative"] = {{"proposer", opt.draft_model ? "draft_model"
                                       : opt.dflash    ? "dflash"
                                                       : "prompt_lookup"},
                          {"num_draft_tokens", opt.num_draft_tokens},
                          {"prompt_lookup", opt.prompt_lookup},
                          {"rounds", s.rounds},
                          {"drafted", s.drafted},
                          {"accepted", s.accepted},
                          {"acceptance_rate", s.acceptance_rate()},
                          {"mean_accepted_length", s.mean_accepted_length()}};
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("backend: %s\ntier: %s\nmodel: %s (%s)\n", backend_description().c_str(),
                model.tier().c_str(), dir.c_str(), model.model_type().c_str());
    if (tp > 1) std::printf("tensor parallel: %d ranks\n", tp);
    if (!adapter.empty()) std::printf("adapter: %s\n", adapter.c_str());
    std::printf("prompt: %d tokens, %.3f tokens-per-sec\n", p, r.prompt_tps);
    std::printf("generation: %d tokens, %.3f tokens-per-sec\n", g, r.generation_tps);
    std::printf("peak memory: %.3f GB\n", r.peak / 1e9);
    std::string kv = "unquantized";
    if (opt.kv_bits) {
      kv = std::to_string(*opt.kv_bits) + "-bit, group " + std::to_string(opt.kv_group_size) +
           ", from token " + std::to_string(opt.quantized_kv_start);
    }
    if (!per_layer.empty()) kv += ", " + std::to_string(per_layer.size()) + " layers by kv_config";
    std::printf("kv cache: %.3f MB, %.1f bytes per token (%s)\n", r.last.kv_bytes / 1e6,
                r.last.kv_bytes_per_token, kv.c_str());
    if (opt.speculative())
      std::printf("%s (last trial)\n", speculative_summary(opt, r.last.speculative).c_str());
  }
}

// "1,4,16": the concurrency levels of one --concurrency run.
std::vector<int> parse_levels(const std::string& spec) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= spec.size()) {
    const size_t end = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, end - pos);
    size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == item.size() && used > 0 && n > 0, "lmx bench",
          "--concurrency expects positive integers separated by commas, got '", item, "'");
    out.push_back(n);
    pos = end + 1;
  }
  return out;
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return v[i];
}

struct ConcurrencyResult {
  double seconds = 0;         // first submit to last token
  double aggregate_tps = 0;   // generated tokens of all streams over `seconds`
  double per_stream_tps = 0;  // mean of each stream's decode rate
  double ttft_p50 = 0, ttft_p99 = 0;
  size_t peak = 0;
  SpeculativeStats speculative;  // summed over the streams
};

// n streams submitted at once to a scheduler of n rows: each a random prompt of prompt_tokens
// and gen_tokens decode steps ignoring EOS (as bench_one), distinct prompts per stream.
ConcurrencyResult bench_concurrent(LanguageModel& model, const GenerateOptions& base, int n,
                                   int prompt_tokens, int gen_tokens, uint32_t seed,
                                   int prefill_step, int prompt_concurrency) {
  using Clock = std::chrono::steady_clock;
  Scheduler s(model, {.max_batch = n,
                      .prompt_concurrency = prompt_concurrency,
                      .prefill_step_size = prefill_step,
                      .prompt_cache_entries = 0});
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, model.vocab_size() - 1);
  std::vector<Clock::time_point> first(n);
  std::vector<std::promise<StreamResult>> done(n);
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    StreamRequest r;
    r.prompt.resize(prompt_tokens);
    for (int& t : r.prompt) t = dist(rng);
    r.options = base;
    r.options.max_tokens = gen_tokens;
    r.options.ignore_eos = true;
    r.on_token = [&first, i, got = false](const StreamToken& t) mutable {
      if (!got && t.token >= 0) first[i] = Clock::now();
      got = got || t.token >= 0;
      return true;
    };
    r.on_done = [&done, i](const StreamResult& res) { done[i].set_value(res); };
    s.submit(std::move(r));
  }
  ConcurrencyResult out;
  std::vector<double> ttft;
  for (int i = 0; i < n; ++i) {
    const StreamResult res = done[i].get_future().get();
    check(res.error.empty(), "lmx bench", "stream ", i, " failed: ", res.error);
    out.per_stream_tps += res.stats.generation_tps() / n;
    out.peak = std::max(out.peak, res.stats.peak_memory);
    out.speculative.rounds += res.stats.speculative.rounds;
    out.speculative.drafted += res.stats.speculative.drafted;
    out.speculative.accepted += res.stats.speculative.accepted;
    ttft.push_back(std::chrono::duration<double>(first[i] - t0).count());
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  out.aggregate_tps = static_cast<double>(n) * gen_tokens / out.seconds;
  out.ttft_p50 = percentile(ttft, 0.5);
  out.ttft_p99 = percentile(ttft, 0.99);
  return out;
}

}  // namespace

int cmd_bench(const Args& args) {
  std::vector<FlagSpec> specs = {
      {"model", "model directory (MLX format) or Hugging Face repo id org/name[@rev]", false,
       "DIR|REPO"},
      {"prompt-tokens", "prompt length", false, "N", "512"},
      {"gen-tokens", "tokens to generate", false, "N", "128"},
      {"workloads", "several runs on one load: PROMPT:GEN pairs, e.g. 16:128,2048:1 (JSON lines)",
       false, "LIST"},
      {"trials", "measured runs after one warm-up", false, "N", "3"},
      {"concurrency",
       "continuous batching: for each N of a list like 1,4,16, N streams at once (aggregate and "
       "per-stream tok/s, TTFT p50/p99)",
       false, "LIST"},
      {"prefill-step-size", "with --concurrency: prompt tokens a joiner prefills per step", false,
       "N", "512"},
      {"prompt-concurrency", "with --concurrency: joining prompts prefilled per step (as serve)",
       false, "N", "1"},
      {"seed", "seed of the random prompt", false, "S", "0"},
      {"prompt-file",
       "the prompt is this file's text instead of random ids (--prompt-tokens ignored)", false,
       "FILE"},
      {"json", "print one JSON line instead of text", true},
      {"exact", "tier L1: stock MLX ops, bit-exact with mlx-lm (default: the fast tier L3)", true},
      adapter_path_flag(),
      offline_flag(),
  };
  for (auto& spec : kv_cache_flags()) specs.push_back(spec);
  for (auto& spec : tensor_parallel_flags()) specs.push_back(spec);
  for (auto& spec : speculative_flags()) specs.push_back(spec);
  Flags f("bench", "Measure prompt (prefill) and decode speed, peak memory and KV cache size.",
          specs);
  if (!f.parse(args)) {
    std::fputs(f.usage().c_str(), stdout);
    return 0;
  }
  const int prompt_tokens = f.integer("prompt-tokens", 512);
  const int gen_tokens = f.integer("gen-tokens", 128);
  const int trials = f.integer("trials", 3);
  check(prompt_tokens > 0 && gen_tokens > 0 && trials > 0, "lmx bench",
        "--prompt-tokens, --gen-tokens and --trials must be > 0");
  const std::string workloads = f.str("workloads");
  const auto runs = workloads.empty()
                        ? std::vector<std::pair<int, int>>{{prompt_tokens, gen_tokens}}
                        : parse_workloads(workloads);
  const bool as_json = f.on("json") || !workloads.empty();
  const std::string dir = f.required("model");
  const std::string model_dir = resolve_model_flag(f);
  const auto adapter = adapter_path(f);
  if (launched_ranks(f, "bench", args)) return 0;
  // Every rank draws the same random prompts (same seed) and runs the same steps.
  const int tp = tensor_parallel_size(f);
  LanguageModel model = LanguageModel::load(
      model_dir, {.exact = f.on("exact"), .tensor_parallel = tp, .adapter_path = adapter});
  notify_rank_ready();
  GenerateOptions opt;
  set_kv_cache_options(f, model, opt);
  const auto seed = static_cast<uint32_t>(f.integer("seed", 0));
  set_speculative_options(f, model, f.on("exact"), opt);
  std::vector<int> text_prompt;
  if (f.has("prompt-file")) {
    std::ifstream in(f.str("prompt-file"));
    check(in.good(), "lmx bench", "cannot read --prompt-file '", f.str("prompt-file"), "'");
    std::stringstream ss;
    ss << in.rdbuf();
    text_prompt = model.encode(ss.str());
    check(!text_prompt.empty(), "lmx bench", "--prompt-file '", f.str("prompt-file"),
          "' has no tokens");
  }
  if (f.has("concurrency")) {
    check(tp == 1, "lmx bench", "--concurrency runs one process, expected no --tp");
    const int step = f.integer("prefill-step-size", 512);
    check(step > 0, "lmx bench", "--prefill-step-size must be > 0, got ", step);
    const int joining = f.integer("prompt-concurrency", 1);
    check(joining > 0, "lmx bench", "--prompt-concurrency must be > 0, got ", joining);
    for (int n : parse_levels(f.str("concurrency"))) {
      // Untimed first, with the same shapes: MLX's JIT compiles (GPU) and first allocations.
      bench_concurrent(model, opt, n, prompt_tokens, 2, seed + 1, step, joining);
      const ConcurrencyResult r =
          bench_concurrent(model, opt, n, prompt_tokens, gen_tokens, seed, step, joining);
      if (as_json) {
        json j = {{"model", dir},
                  {"backend", backend_description()},
                  {"tier", model.tier()},
                  {"concurrency", n},
                  {"prompt_concurrency", joining},
                  {"prompt_tokens", prompt_tokens},
                  {"gen_tokens", gen_tokens},
                  {"seconds", r.seconds},
                  {"aggregate_tps", r.aggregate_tps},
                  {"per_stream_tps", r.per_stream_tps},
                  {"ttft_p50_s", r.ttft_p50},
                  {"ttft_p99_s", r.ttft_p99},
                  {"peak_memory_gb", r.peak / 1e9}};
        if (opt.speculative()) {
          const SpeculativeStats& s = r.speculative;
          j["speculative"] = {{"rounds", s.rounds},
                              {"drafted", s.drafted},
                              {"accepted", s.accepted},
                              {"acceptance_rate", s.acceptance_rate()},
                              {"mean_accepted_length", s.mean_accepted_length()}};
        }
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf(
            "concurrency %d: %d x (%d prompt + %d generated) tokens in %.2f s; aggregate %.1f "
            "tok/s, per stream %.1f tok/s; TTFT p50 %.3f s, p99 %.3f s; peak %.3f GB\n",
            n, n, prompt_tokens, gen_tokens, r.seconds, r.aggregate_tps, r.per_stream_tps,
            r.ttft_p50, r.ttft_p99, r.peak / 1e9);
      }
      std::fflush(stdout);
    }
    return 0;
  }
  for (const auto& [p, g] : runs) {
    const BenchResult r = bench_one(model, opt, p, g, trials, seed, text_prompt);
    const int prompt_len = text_prompt.empty() ? p : static_cast<int>(text_prompt.size());
    print_result(dir, model, opt, prompt_len, g, r, as_json, tp, f.str("adapter-path"));
  }
  return 0;
}

}  // namespace lmx::cli
