// LoRA adapters in mlx-lm's format (an `--adapter-path` directory: adapter_config.json and
// adapters.safetensors), applied at load the way mlx_lm.utils.load(path, adapter_path=...) does:
// tuner.utils.linear_to_lora_layers picks the modules, tuner/lora.py and dora.py give the
// numerics (docs/lora.md).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "nn/adapter_router.h"
#include "nn/layers.h"

namespace lmx::lora {

namespace fs = std::filesystem;

// adapter_config.json's loading fields (the rest of mlx_lm.lora's training arguments is ignored).
struct AdapterConfig {
  std::string fine_tune_type = "lora";  // lora, dora or full
  int num_layers = 16;                  // the last num_layers layers; <= 0: all
  int rank = 8;
  float scale = 20.0f;                           // a plain multiplier: no alpha / rank
  float dropout = 0.0f;                          // training only
  std::optional<std::vector<std::string>> keys;  // module names; unset: every linear of a layer
};

// Reads and checks dir/adapter_config.json. Throws lmx::Error naming the file and field.
AdapterConfig read_adapter_config(const fs::path& dir);

// mlx-lm LoRALinear: y + (scale * ((x @ lora_a) @ lora_b)).astype(x.dtype); lora_a (in, rank),
// lora_b (rank, out). Dropout is the identity at inference.
class LoRALinear : public nn::LinearAdapter {
 public:
  LoRALinear(mx::array lora_a, mx::array lora_b, float scale)
      : a_(std::move(lora_a)), b_(std::move(lora_b)), scale_(scale) {}
  mx::array operator()(const mx::array& x, const mx::array& y) const override;

 private:
  mx::array a_, b_;
  float scale_;
};

// mlx-lm DoRALinear: the base weight W (dequantized if quantized) and the low-rank term in one
// output, rescaled per output row by m / ||W + scale * B^T A^T||, the layer bias added last.
class DoRALinear : public nn::LinearAdapter {
 public:
  DoRALinear(const nn::Linear& base, mx::array lora_a, mx::array lora_b, mx::array m, float scale);
  mx::array operator()(const mx::array& x, const mx::array& y) const override;
  bool replaces_base() const override { return true; }

 private:
  mx::array weight() const;
  mx::array w_;
  std::optional<mx::array> scales_, biases_, bias_;
  std::optional<QuantSpec> quant_;
  mx::array a_, b_, m_;
  float scale_;
};

// mlx-lm LoRAEmbedding: lora_a (vocab, rank), lora_b (rank, dims); the lookup adds
// scale * lora_a[ids] @ lora_b, the tied head scale * (x @ lora_b^T) @ lora_a^T.
class LoRAEmbedding : public nn::EmbeddingAdapter {
 public:
  LoRAEmbedding(mx::array lora_a, mx::array lora_b, float scale)
      : a_(std::move(lora_a)), b_(std::move(lora_b)), scale_(scale) {}
  mx::array lookup(const mx::array& ids, const mx::array& y) const override;
  mx::array as_linear(const mx::array& x, const mx::array& y) const override;

 private:
  mx::array a_, b_;
  float scale_;
};

// mlx-lm LoRASwitchLinear: lora_a (experts, rank, in), lora_b (experts, out, rank), applied to
// each row's expert with gather_mm.
class LoRASwitchLinear : public nn::SwitchAdapter {
 public:
  LoRASwitchLinear(mx::array lora_a, mx::array lora_b, float scale)
      : a_(std::move(lora_a)), b_(std::move(lora_b)), scale_(scale) {}
  mx::array operator()(const mx::array& x, const mx::array& indices, bool sorted_indices,
                       const mx::array& y) const override;

 private:
  mx::array a_, b_;
  float scale_;
};

// One adapter directory, attached to a model while it loads (WeightStore::set_adapters).
class Adapter : public nn::AdapterSource {
 public:
  // Reads dir/adapter_config.json and dir/adapters.safetensors. Throws lmx::Error for a missing
  // directory or file, a bad field, a PEFT-format adapter.
  static std::unique_ptr<Adapter> open(const fs::path& dir);

  const AdapterConfig& config() const { return config_; }
  bool full() const { return config_.fine_tune_type == "full"; }
  // fine_tune_type full: the adapter's tensors replace the checkpoint's of the same name and
  // shape (after sanitize); a name the checkpoint lacks or a shape that differs is an error.
  void replace_weights(Weights& checkpoint);
  // lora / dora: learns the decoder layers' path prefix ("model.layers.", for the wrappers
  // "language_model.model.layers.") and their count from the checkpoint's tensor names.
  void bind(const Weights& checkpoint);
  // The same from module or tensor names.
  void bind(const std::vector<std::string>& names);
  // After the model is built: every adapter tensor went to a module the config selects.
  void check_all_used() const;

  std::vector<std::shared_ptr<const nn::LinearAdapter>> linear(const std::string& path,
                                                               const nn::Linear& base, int in,
                                                               int out) override;
  std::vector<std::shared_ptr<const nn::EmbeddingAdapter>> embedding(const std::string& path,
                                                                     const nn::Embedding& base,
                                                                     int vocab, int dims) override;
  std::vector<std::shared_ptr<const nn::SwitchAdapter>> switch_linear(const std::string& path,
                                                                      int in, int out,
                                                                      int experts) override;

 private:
  Adapter(fs::path dir, AdapterConfig config, Weights weights);
  // linear_to_lora_layers' choice: a full path among the keys (a top-level module such as
  // lm_head), or a module of one of the last num_layers layers whose name in the layer is among
  // the keys (every module without keys).
  bool selected(const std::string& path) const;
  mx::array take(const std::string& name, const mx::Shape& shape, const std::string& what);
  std::string file() const;

  fs::path dir_;
  AdapterConfig config_;
  Weights weights_;
  std::set<std::string> used_;
  std::string layers_prefix_;
  int num_model_layers_ = 0;
};

// Loads an adapter directory into a model's router under `name` (per-request adapters,
// LanguageModel::load_adapter). Throws lmx::Error for anything but fine_tune_type lora, tensors
// for modules the router has no site for (MoE experts among them), and as Adapter::open does.
void load_routed(nn::AdapterRouter& router, const std::string& name, const fs::path& dir);

}  // namespace lmx::lora
