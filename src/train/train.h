// LoRA fine-tuning as mlx_lm.lora (lora.py, tuner/trainer.py, tuner/lora.py, tuner/utils.py):
// the model runs tier L1 (stock MLX ops, differentiable) with trainable LoRA adapters on the
// selected Linear layers, the loss is mlx-lm's masked cross-entropy, gradients come from MLX's
// autograd (mx::value_and_grad) and mlx.optimizers' Adam / AdamW update them. Quantized base
// layers stay quantized (QLoRA). docs/training.md.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "train/data.h"

namespace lmx::train {

// lr_schedule: mlx.optimizers.schedulers `name` called with `arguments`, after `warmup` steps of
// linear warmup from warmup_init (tuner.utils.build_schedule).
struct Schedule {
  std::string name;  // cosine_decay, linear_schedule, exponential_decay, step_decay
  std::vector<double> arguments;
  int warmup = 0;
  double warmup_init = 0.0;
};

// mlx_lm.lora's arguments (CONFIG_DEFAULTS), after YAML and flags are merged.
struct TrainOptions {
  fs::path model;
  fs::path data;
  bool train = false;
  bool test = false;
  std::string fine_tune_type = "lora";
  // sft: mlx-lm's next-token loss. dpo (beta; the reference is the model without the adapter,
  // or the initial weights of a full fine-tune) and orpo (lambda, reference-free) train on
  // prompt / chosen / rejected rows.
  std::string train_mode = "sft";
  double beta = 0.1;
  double lambda = 0.1;
  std::string optimizer = "adam";  // adam or adamw
  // optimizer_config[optimizer]: betas, eps, bias_correction, weight_decay (adamw).
  json optimizer_config = json::object();
  int seed = 0;
  int num_layers = 16;  // the last num_layers layers; -1: all
  int batch_size = 4;
  int iters = 1000;
  int val_batches = 25;  // -1: the whole validation set
  double learning_rate = 1e-5;
  int steps_per_report = 10;
  int steps_per_eval = 200;
  std::optional<fs::path> resume_adapter_file;
  fs::path adapter_path = "adapters";
  int save_every = 100;
  int test_batches = 500;
  int max_seq_length = 2048;
  int grad_accumulation_steps = 1;
  bool grad_checkpoint = false;  // recompute each layer in the backward pass (llama-style)
  std::optional<Schedule> lr_schedule;
  int rank = 8;
  float scale = 20.0f;
  double dropout = 0.0;
  std::optional<std::vector<std::string>> keys;
  DataOptions data_options;
  std::optional<fs::path> metrics_file;  // one JSON object per report, val loss and test line
  json args;  // every argument, written to adapter_config.json as mlx-lm's save_config does

  // From mlx_lm.lora's argument dictionary (flags over the YAML file over CONFIG_DEFAULTS).
  // Throws lmx::Error naming the bad field.
  static TrainOptions from_args(const json& args);
};

// CONFIG_DEFAULTS of mlx_lm.lora, keyed as its YAML files are.
json default_args();

// One report: {"iteration", "train_loss", "learning_rate", "iterations_per_second",
// "tokens_per_second", "trained_tokens", "peak_memory"}, {"iteration", "val_loss", "val_time"}
// or {"test_loss", "test_ppl"}, as mlx-lm's training callbacks get them. DPO and ORPO reports
// add "reward_margin" (train and val: the mean chosen minus rejected reward).
using MetricsCallback = std::function<void(const json&)>;

// --train and / or --test. Prints mlx-lm-style progress lines to stdout.
void run(const TrainOptions& options, const MetricsCallback& on_metrics = {});

}  // namespace lmx::train
