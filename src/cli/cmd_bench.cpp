#include <algorithm>
#include <cstdio>
#include <random>
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
BenchResult bench_one(LanguageModel& model, GenerateOptions opt, int prompt_tokens, int gen_tokens,
                      int trials, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, model.vocab_size() - 1);
  std::vector<int> prompt(prompt_tokens);
  for (int& t : prompt) t = dist(rng);
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
  }
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
      {"seed", "seed of the random prompt", false, "S", "0"},
      {"json", "print one JSON line instead of text", true},
      {"exact", "tier L1: stock MLX ops, bit-exact with mlx-lm (default: the fast tier L3)", true},
      adapter_path_flag(),
      offline_flag(),
  };
  for (auto& spec : kv_cache_flags()) specs.push_back(spec);
  for (auto& spec : tensor_parallel_flags()) specs.push_back(spec);
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
  for (const auto& [p, g] : runs) {
    const BenchResult r = bench_one(model, opt, p, g, trials, seed);
    print_result(dir, model, opt, p, g, r, as_json, tp, f.str("adapter-path"));
  }
  return 0;
}

}  // namespace lmx::cli
