// lmx lora: mlx_lm.lora's flags and YAML config (-c); flags win over the file, the file over
// mlx-lm's defaults (docs/training.md).
#include <cstdio>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "hub/hub.h"
#include "train/train.h"
#include "train/yaml.h"

namespace lmx::cli {

namespace {

enum class Kind { str, integer, number, on };

struct Arg {
  const char* flag;
  const char* key;
  Kind kind;
  const char* help;
  const char* metavar = "";
};

const std::vector<Arg>& lora_args() {
  static const std::vector<Arg> args = {
      {"model", "model", Kind::str, "model directory or hub repo id", "PATH|REPO"},
      {"train", "train", Kind::on, "train an adapter"},
      {"data", "data", Kind::str, "directory with train.jsonl, valid.jsonl, test.jsonl", "DIR"},
      {"fine-tune-type", "fine_tune_type", Kind::str, "lora, dora or full", "TYPE"},
      {"train-mode", "train_mode", Kind::str, "sft, or dpo / orpo on prompt/chosen/rejected rows",
       "MODE"},
      {"beta", "beta", Kind::number, "DPO temperature (default 0.1)", "B"},
      {"lambda", "lambda", Kind::number, "ORPO odds-ratio weight (default 0.1)", "L"},
      {"optimizer", "optimizer", Kind::str, "adam or adamw", "NAME"},
      {"mask-prompt", "mask_prompt", Kind::on, "no loss on the prompt (chat, completions)"},
      {"num-layers", "num_layers", Kind::integer, "layers to fine-tune, from the last; -1: all",
       "N"},
      {"batch-size", "batch_size", Kind::integer, "minibatch size", "N"},
      {"iters", "iters", Kind::integer, "iterations to train for", "N"},
      {"val-batches", "val_batches", Kind::integer, "validation batches; -1: the whole set", "N"},
      {"learning-rate", "learning_rate", Kind::number, "Adam learning rate", "LR"},
      {"steps-per-report", "steps_per_report", Kind::integer, "steps between loss reports", "N"},
      {"steps-per-eval", "steps_per_eval", Kind::integer, "steps between validations", "N"},
      {"grad-accumulation-steps", "grad_accumulation_steps", Kind::integer,
       "steps accumulated before each optimizer update", "N"},
      {"resume-adapter-file", "resume_adapter_file", Kind::str,
       "start from these adapter weights (.safetensors)", "FILE"},
      {"adapter-path", "adapter_path", Kind::str, "where the adapter is saved / loaded", "DIR"},
      {"save-every", "save_every", Kind::integer, "save a checkpoint every N iterations", "N"},
      {"test", "test", Kind::on, "evaluate on test.jsonl (after training, if --train)"},
      {"test-batches", "test_batches", Kind::integer, "test batches; -1: the whole set", "N"},
      {"max-seq-length", "max_seq_length", Kind::integer, "longer sequences are truncated", "N"},
      {"grad-checkpoint", "grad_checkpoint", Kind::on,
       "recompute each layer in the backward pass (less memory)"},
      {"seed", "seed", Kind::integer, "the PRNG seed", "N"},
      {"metrics-file", "metrics_file", Kind::str, "append each report as a JSON line", "FILE"},
  };
  return args;
}

}  // namespace

int cmd_lora(const Args& args) {
  std::vector<FlagSpec> specs;
  for (const auto& a : lora_args())
    specs.push_back({a.flag, a.help, a.kind == Kind::on, a.metavar});
  specs.push_back(
      {"config", "a YAML file with the training options (mlx_lm.lora's)", false, "FILE"});
  specs.push_back({"c", "(-c) short for --config", false, "FILE"});
  specs.push_back(offline_flag());
  Flags f(
      "lora",
      "LoRA / DoRA / QLoRA / full fine-tuning as mlx_lm.lora: the same flags, YAML config, data\n"
      "formats, losses and adapter format (adapter_config.json + adapters.safetensors), which\n"
      "`lmx generate --adapter-path` and mlx_lm.load(..., adapter_path=...) load; and DPO / ORPO\n"
      "(--train-mode) on prompt/chosen/rejected rows. The model runs tier L1 (stock MLX ops).\n"
      "See docs/training.md.",
      specs);
  if (!f.parse(args)) {
    std::fputs(f.usage().c_str(), stdout);
    return 0;
  }
  try {
    json merged = json::object();
    for (const auto& a : lora_args()) {
      if (!f.has(a.flag)) continue;
      switch (a.kind) {
        case Kind::str:
          merged[a.key] = f.str(a.flag);
          break;
        case Kind::integer:
          merged[a.key] = f.integer(a.flag, 0);
          break;
        case Kind::number:
          merged[a.key] = static_cast<double>(f.number(a.flag, 0));
          break;
        case Kind::on:
          merged[a.key] = true;
          break;
      }
    }
    if (f.has("learning-rate")) merged["learning_rate"] = std::stod(f.str("learning-rate"));
    const std::string config = f.has("c") ? f.str("c") : f.str("config");
    if (!config.empty()) {
      std::printf("Loading configuration file %s\n", config.c_str());
      const json y = train::read_yaml_file(config);
      check(y.is_object() || y.is_null(), config, "expected a mapping of options");
      if (y.is_object())
        for (const auto& [k, v] : y.items())
          if (!merged.contains(k) || merged[k].is_null()) merged[k] = v;
      merged["config"] = config;
    }
    const json defaults = train::default_args();
    for (const auto& [k, v] : defaults.items())
      if (!merged.contains(k) || merged[k].is_null()) merged[k] = v;
    check(!merged["model"].is_null(), "lmx lora", "missing --model (or `model:` in the config)");
    hub::HubOptions ho;
    if (f.on("offline")) ho.offline = true;
    train::TrainOptions o = train::TrainOptions::from_args(merged);
    o.model = hub::resolve_model(merged["model"].get<std::string>(), ho);
    train::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lmx lora: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace lmx::cli
