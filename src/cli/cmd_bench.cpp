#include <cstdio>
#include <random>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "core/json.h"

namespace lmx::cli {

// Like mlx_lm.benchmark: a random prompt of --prompt-tokens ids, then --gen-tokens decode steps
// that ignore EOS; reports the mean over trials after one warm-up run.
int cmd_bench(const Args& args) {
  std::vector<FlagSpec> specs = {
      {"model", "model directory (MLX format)", false, "DIR"},
      {"prompt-tokens", "prompt length", false, "N", "512"},
      {"gen-tokens", "tokens to generate", false, "N", "128"},
      {"trials", "measured runs after one warm-up", false, "N", "3"},
      {"seed", "seed of the random prompt", false, "S", "0"},
      {"json", "print one JSON line instead of text", true},
      {"exact", "tier L1: stock MLX ops, bit-exact with mlx-lm (default: the fast tier L3)", true},
  };
  for (auto& spec : kv_cache_flags()) specs.push_back(spec);
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
  const std::string dir = f.required("model");
  LanguageModel model = LanguageModel::load(dir, {.exact = f.on("exact")});

  std::mt19937 rng(static_cast<uint32_t>(f.integer("seed", 0)));
  std::uniform_int_distribution<int> dist(0, model.vocab_size() - 1);
  std::vector<int> prompt(prompt_tokens);
  for (int& t : prompt) t = dist(rng);

  GenerateOptions opt;
  opt.max_tokens = gen_tokens;
  opt.ignore_eos = true;
  set_kv_cache_options(f, opt);
  auto run = [&] { return model.generate(prompt, opt, [](const TokenOutput&) { return true; }); };
  run();  // warm-up
  double ptps = 0, gtps = 0;
  size_t peak = 0;
  GenerationStats last;
  for (int i = 0; i < trials; ++i) {
    last = run();
    ptps += last.prompt_tps();
    gtps += last.generation_tps();
    peak = std::max(peak, last.peak_memory);
  }
  ptps /= trials;
  gtps /= trials;
  if (f.on("json")) {
    json j = {{"model", dir},
              {"backend", backend_description()},
              {"tier", model.tier()},
              {"prompt_tokens", prompt_tokens},
              {"gen_tokens", gen_tokens},
              {"prompt_tps", ptps},
              {"generation_tps", gtps},
              {"peak_memory_gb", peak / 1e9},
              {"kv_bits", opt.kv_bits ? json(*opt.kv_bits) : json()},
              {"kv_bytes", last.kv_bytes},
              {"kv_bytes_per_token", last.kv_bytes_per_token}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("backend: %s\ntier: %s\nmodel: %s (%s)\n", backend_description().c_str(),
                model.tier().c_str(), dir.c_str(), model.model_type().c_str());
    std::printf("prompt: %d tokens, %.3f tokens-per-sec\n", prompt_tokens, ptps);
    std::printf("generation: %d tokens, %.3f tokens-per-sec\n", gen_tokens, gtps);
    std::printf("peak memory: %.3f GB\n", peak / 1e9);
    std::string kv = "unquantized";
    if (opt.kv_bits) {
      kv = std::to_string(*opt.kv_bits) + "-bit, group " + std::to_string(opt.kv_group_size) +
           ", from token " + std::to_string(opt.quantized_kv_start);
    }
    std::printf("kv cache: %.3f MB, %.1f bytes per token (%s)\n", last.kv_bytes / 1e6,
                last.kv_bytes_per_token, kv.c_str());
  }
  return 0;
}

}  // namespace lmx::cli
