#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "cli/flags.h"
#include "lmx/lmx.h"

namespace lmx::cli {

std::vector<FlagSpec> sampling_flags() {
  return {
      {"model", "model directory (MLX format)", false, "DIR"},
      {"prompt", "prompt text ('-' reads standard input)", false, "TEXT"},
      {"max-tokens", "maximum number of tokens to generate", false, "N", "256"},
      {"temp", "sampling temperature, 0 = greedy", false, "T", "0"},
      {"top-p", "nucleus sampling threshold", false, "P", "0 (off)"},
      {"top-k", "sample from the k most likely tokens", false, "K", "0 (off)"},
      {"min-p", "minimum probability relative to the top token", false, "P", "0 (off)"},
      {"min-tokens-to-keep", "tokens min-p always keeps", false, "N", "1"},
      {"repetition-penalty", "penalty for repeated tokens", false, "F", "off"},
      {"repetition-context-size", "tokens the repetition penalty looks back", false, "N", "20"},
      {"seed", "random seed", false, "S"},
      {"prefill-step-size", "prompt tokens per prefill chunk", false, "N", "2048"},
      {"exact", "tier L1: stock MLX ops, bit-exact with mlx-lm (default: the fast tier L3)", true},
      {"ignore-chat-template", "(accepted for mlx_lm compatibility; prompts are used as given)",
       true},
  };
}

std::vector<FlagSpec> kv_cache_flags() {
  return {
      {"kv-bits", "quantize the KV cache to this many bits (2-6, 8)", false, "B", "off"},
      {"kv-group-size", "group size of the KV cache quantization", false, "N", "64"},
      {"quantized-kv-start", "quantize the KV cache once it holds this many tokens", false, "N",
       "5000"},
  };
}

void set_kv_cache_options(const Flags& f, GenerateOptions& o) {
  o.kv_bits = f.opt_integer("kv-bits");
  o.kv_group_size = f.integer("kv-group-size", 64);
  o.quantized_kv_start = f.integer("quantized-kv-start", 5000);
}

GenerateOptions generate_options(const Flags& f) {
  GenerateOptions o;
  o.max_tokens = f.integer("max-tokens", 256);
  o.prefill_step_size = f.integer("prefill-step-size", 2048);
  o.sampler.temp = f.number("temp", 0.0f);
  o.sampler.top_p = f.number("top-p", 0.0f);
  o.sampler.top_k = f.integer("top-k", 0);
  o.sampler.min_p = f.number("min-p", 0.0f);
  o.sampler.min_tokens_to_keep = f.integer("min-tokens-to-keep", 1);
  o.processors.repetition_penalty = f.opt_number("repetition-penalty");
  o.processors.repetition_context_size = f.integer("repetition-context-size", 20);
  if (auto s = f.opt_integer("seed")) o.seed = static_cast<uint64_t>(*s);
  set_kv_cache_options(f, o);
  return o;
}

std::string prompt_text(const Flags& f) {
  std::string p = f.required("prompt");
  if (p == "-") {
    p.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  return p;
}

int cmd_generate(const Args& args) {
  Flags f("generate", "Generate text from a prompt; tokens stream to standard output.",
          sampling_flags());
  for (auto& spec : kv_cache_flags()) f.add(spec);
  f.add({"verbose", "print speed and memory statistics to standard error", true});
  if (!f.parse(args)) {
    std::fputs(f.usage().c_str(), stdout);
    return 0;
  }
  const GenerateOptions opt = generate_options(f);
  const std::string prompt = prompt_text(f);
  LanguageModel model = LanguageModel::load(f.required("model"), {.exact = f.on("exact")});
  const std::vector<int> ids = model.encode(prompt);
  GenerationStats st = model.generate(ids, opt, [](const TokenOutput& t) {
    std::fwrite(t.text.data(), 1, t.text.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  if (f.on("verbose")) {
    std::fprintf(stderr, "tier: %s\n", model.tier().c_str());
    std::fprintf(stderr,
                 "prompt: %d tokens, %.3f tokens-per-sec\n"
                 "generation: %d tokens, %.3f tokens-per-sec\n"
                 "peak memory: %.3f GB\n"
                 "kv cache: %.3f MB, %.1f bytes per token\n",
                 st.prompt_tokens, st.prompt_tps(), st.generation_tokens, st.generation_tps(),
                 st.peak_memory / 1e9, st.kv_bytes / 1e6, st.kv_bytes_per_token);
  }
  return 0;
}

}  // namespace lmx::cli
