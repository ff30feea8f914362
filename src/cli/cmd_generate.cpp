#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "core/progress.h"
#include "lmx/lmx.h"

namespace lmx::cli {

std::vector<FlagSpec> sampling_flags() {
  return {
      {"model", "model directory (MLX format) or Hugging Face repo id org/name[@rev]", false,
       "DIR|REPO"},
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
      {"prefill-step-size", "prompt tokens per prefill chunk (tier L3 on the CPU: at most 256)",
       false, "N", "2048"},
      {"exact", "tier L1: stock MLX ops, bit-exact with mlx-lm (default: the fast tier L3)", true},
      {"ignore-chat-template", "(accepted for mlx_lm compatibility; prompts are used as given)",
       true},
      adapter_path_flag(),
      offline_flag(),
  };
}

FlagSpec adapter_path_flag() {
  return {"adapter-path",
          "LoRA / DoRA adapter directory in mlx-lm's format (adapter_config.json, "
          "adapters.safetensors), or a Hugging Face repo id of one",
          false, "DIR|REPO"};
}

std::optional<std::filesystem::path> adapter_path(const Flags& f) {
  if (!f.has("adapter-path")) return std::nullopt;
  return std::filesystem::path(resolve_model_flag(f, "adapter-path"));
}

std::vector<FlagSpec> kv_cache_flags() {
  return {
      {"kv-bits", "quantize the KV cache to this many bits (2-6, 8)", false, "B", "off"},
      {"kv-group-size", "group size of the KV cache quantization", false, "N", "64"},
      {"quantized-kv-start", "quantize the KV cache once it holds this many tokens", false, "N",
       "5000"},
      {"kv-config", "per-layer KV bits: a kv_config.json, or 'off'", false, "PATH|off",
       "the model's kv_config.json, if any"},
  };
}

void set_kv_cache_options(const Flags& f, const LanguageModel& model, GenerateOptions& o) {
  o.kv_bits = f.opt_integer("kv-bits");
  o.kv_group_size = f.integer("kv-group-size", 64);
  o.quantized_kv_start = f.integer("quantized-kv-start", 5000);
  if (f.has("kv-config")) {
    const std::string path = f.str("kv-config");
    o.kv_config = path == "off" ? std::vector<KVLayerBits>{} : model.read_kv_config(path);
  }
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
  return o;
}

std::vector<FlagSpec> speculative_flags() {
  return {
      {"draft-model",
       "speculative decoding: a draft model of the same vocabulary, or a DFlash block drafter "
       "made for the model (detected from its config.json)",
       false, "DIR|REPO"},
      {"num-draft-tokens", "tokens proposed per verification (draft model or prompt lookup)", false,
       "K", "3; a DFlash drafter's block size - 1"},
      {"prompt-lookup",
       "speculative decoding without a draft: propose what followed the last N-gram (N..1) "
       "earlier in prompt + output",
       false, "N", "off"},
  };
}

void set_speculative_options(const Flags& f, const LanguageModel& model, bool exact,
                             GenerateOptions& o) {
  o.num_draft_tokens = f.integer("num-draft-tokens", 3);
  o.prompt_lookup = f.integer("prompt-lookup", 0);
  const bool spec = f.has("draft-model") || f.has("prompt-lookup");
  check(!f.has("num-draft-tokens") || spec, "lmx",
        "--num-draft-tokens needs --draft-model or --prompt-lookup");
  check(o.num_draft_tokens >= 1, "lmx", "--num-draft-tokens must be >= 1, got ",
        o.num_draft_tokens);
  check(!f.has("prompt-lookup") || o.prompt_lookup >= 1, "lmx",
        "--prompt-lookup must be >= 1, got ", o.prompt_lookup);
  check(!(f.has("draft-model") && f.has("prompt-lookup")), "lmx",
        "--draft-model and --prompt-lookup were both given, expected one");
  if (!f.has("draft-model")) return;
  const std::string dir = resolve_model_flag(f, "draft-model");
  check(std::filesystem::is_directory(dir), "lmx", "--draft-model '", dir,
        "' is not a model directory");
  if (is_dflash_drafter(dir)) {
    o.dflash = load_dflash_drafter(dir);
    // The drafter was trained to fill its whole block.
    if (!f.has("num-draft-tokens")) o.num_draft_tokens = dflash_block_size(*o.dflash) - 1;
    return;
  }
  o.draft_model = std::make_shared<LanguageModel>(LanguageModel::load(dir, {.exact = exact}));
  check(o.draft_model->vocab_size() == model.vocab_size(), "lmx",
        "the draft model's vocabulary has ", o.draft_model->vocab_size(),
        " tokens, the model's has ", model.vocab_size(), ", expected the same vocabulary");
}

std::string speculative_summary(const GenerateOptions& o, const SpeculativeStats& s) {
  if (!o.speculative()) return "";
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "speculative (%s, K=%d): %d rounds, %d drafted, %d accepted (%.1f%%), mean "
                "accepted length %.2f tokens per target forward",
                o.draft_model ? "draft model"
                : o.dflash    ? "dflash"
                              : "prompt lookup",
                o.num_draft_tokens, s.rounds, s.drafted, s.accepted, 100.0 * s.acceptance_rate(),
                s.mean_accepted_length());
  return buf;
}

std::string prompt_text(const Flags& f) {
  std::string p = f.required("prompt");
  if (p == "-") {
    p.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  return p;
}

std::vector<FlagSpec> tensor_parallel_flags() {
  return {
      {"tp", "tensor parallelism: run N ranks on this host (docs/distributed.md)", false, "N", "1"},
      {"tp-timeout", "seconds every rank may take to start", false, "S", "600"},
  };
}

int tensor_parallel_size(const Flags& f) {
  const int tp = f.integer("tp", 1);
  check(tp >= 1, "lmx", "--tp must be >= 1, got ", tp);
  return tp;
}

bool launched_ranks(const Flags& f, const std::string& command, const Args& args,
                    const std::string& prompt) {
  const int tp = tensor_parallel_size(f);
  if (tp == 1 || tensor_parallel_rank()) return false;
  // Each rank gets the same arguments, a '-' prompt replaced by the text read here (standard
  // input is read once, by the launcher).
  std::vector<std::string> argv{std::filesystem::read_symlink("/proc/self/exe").string(), command};
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--prompt=-") {
      argv.push_back("--prompt=" + prompt);
    } else if (args[i] == "--prompt" && i + 1 < args.size() && args[i + 1] == "-") {
      argv.insert(argv.end(), {"--prompt", prompt});
      ++i;
    } else {
      argv.push_back(args[i]);
    }
  }
  launch_ranks(argv, {tp, f.number("tp-timeout", 600)});
  return true;
}

int cmd_generate(const Args& args) {
  Flags f("generate", "Generate text from a prompt; tokens stream to standard output.",
          sampling_flags());
  for (auto& spec : kv_cache_flags()) f.add(spec);
  for (auto& spec : tensor_parallel_flags()) f.add(spec);
  for (auto& spec : speculative_flags()) f.add(spec);
  f.add({"verbose", "print speed and memory statistics to standard error", true});
  f.add({"json-schema", "constrain the output to JSON valid against this schema file", false,
         "FILE"});
  f.add({"json-object", "constrain the output to a JSON object", true});
  if (!f.parse(args)) {
    std::fputs(f.usage().c_str(), stdout);
    return 0;
  }
  GenerateOptions opt = generate_options(f);
  const std::string prompt = prompt_text(f);
  // Resolved (downloaded) once here, before any tensor-parallel rank starts.
  const std::string model_dir = resolve_model_flag(f);
  const auto adapter = adapter_path(f);
  if (launched_ranks(f, "generate", args, prompt)) return 0;
  LanguageModel model = LanguageModel::load(model_dir, {.exact = f.on("exact"),
                                                        .tensor_parallel = tensor_parallel_size(f),
                                                        .adapter_path = adapter});
  notify_rank_ready();
  // Every rank generates the same tokens; only rank 0 reports (the launcher drops the others'
  // standard output).
  const bool report = tensor_parallel_rank().value_or(0) == 0;
  set_kv_cache_options(f, model, opt);
  set_speculative_options(f, model, f.on("exact"), opt);
  if (f.has("json-schema")) {
    std::ifstream in(f.str("json-schema"));
    check(in.good(), "lmx generate", "cannot read --json-schema '", f.str("json-schema"), "'");
    std::stringstream ss;
    ss << in.rdbuf();
    opt.constraint = model.json_schema_constraint(ss.str());
  } else if (f.on("json-object")) {
    opt.constraint = model.json_object_constraint();
  }
  const std::vector<int> ids = model.encode(prompt);
  // --verbose: a progress line for prompts of more than one prefill chunk (the download bar's
  // style: redrawn on a terminal, plain lines otherwise).
  std::shared_ptr<ProgressBar> prefill_bar;
  if (f.on("verbose") && report && static_cast<int>(ids.size()) > opt.prefill_step_size + 1)
    opt.on_prefill = [&prefill_bar](int done, int total) {
      if (!prefill_bar)
        prefill_bar = std::make_shared<ProgressBar>("prefill", total - 1, 0,
                                                    ProgressOptions{.unit = "tokens"});
      prefill_bar->update(done);
      if (done == total - 1) prefill_bar->finish();
    };
  GenerationStats st = model.generate(ids, opt, [](const TokenOutput& t) {
    std::fwrite(t.text.data(), 1, t.text.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  if (f.on("verbose") && report) {
    std::fprintf(stderr, "tier: %s\n", model.tier().c_str());
    std::fprintf(stderr,
                 "prompt: %d tokens, %.3f tokens-per-sec\n"
                 "generation: %d tokens, %.3f tokens-per-sec\n"
                 "peak memory: %.3f GB\n"
                 "kv cache: %.3f MB, %.1f bytes per token\n",
                 st.prompt_tokens, st.prompt_tps(), st.generation_tokens, st.generation_tps(),
                 st.peak_memory / 1e9, st.kv_bytes / 1e6, st.kv_bytes_per_token);
    if (opt.speculative())
      std::fprintf(stderr, "%s\n", speculative_summary(opt, st.speculative).c_str());
  }
  return 0;
}

}  // namespace lmx::cli
