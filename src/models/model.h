// The model interface, the registry by model_type, and checkpoint loading.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "lmx/lmx.h"

namespace lmx {

namespace nn {
struct AdapterSource;
class AdapterRouter;
}  // namespace nn

struct QuantSpec {
  int bits = 4;
  int group_size = 64;
  std::string mode = "affine";
};

// config.json's `quantization` block: defaults plus per-module overrides (false = keep float).
struct QuantConfig {
  std::optional<QuantSpec> defaults;
  std::map<std::string, std::optional<QuantSpec>> modules;
  static QuantConfig from_config(const json& config, const std::string& source);
};

// Tensor parallelism (mlx-lm's Model.shard): this process is rank `rank` of `size`, and `group`
// carries the all-sums of the sharded-to-all projections. size 1 loads the whole model.
struct ShardSpec {
  int rank = 0;
  int size = 1;
  std::optional<mx::distributed::Group> group;
};

// Checkpoint tensors after `sanitize`; every tensor must be taken exactly once, with its shape
// checked (mlx-lm's load_weights(strict=True)).
class WeightStore {
 public:
  WeightStore(Weights weights, QuantConfig quant, std::string source);

  bool has(const std::string& key) const { return weights_.count(key) > 0; }
  mx::array take(const std::string& key, const mx::Shape& shape);
  std::optional<mx::array> take_optional(const std::string& key, const mx::Shape& shape);
  // Drops the store's reference to a taken tensor that its layer replaced (tier L3's packed copy
  // in place, float16 scales), so its bytes go while the load goes on, not after it: freed
  // arrays below glibc's mmap threshold stay resident in the heap until trimmed, so every 16 MiB
  // released the heap is trimmed (Gemma 3 270M's float32 scales held ~40 MB at the load's end).
  // The key stays used; taking it again is an error.
  void release(const std::string& key);
  // mlx-lm's class_predicate: a config entry for the module wins, else quantized iff
  // `<path>.scales` exists, with the default bits and group size.
  std::optional<QuantSpec> quant_for(const std::string& module_path, int in_dims) const;
  void check_all_used() const;
  const std::string& source() const { return source_; }
  // The tensor-parallel spec of this load; models that shard read it (which marks it consumed).
  void set_shard(ShardSpec spec) { shard_ = std::move(spec); }
  const ShardSpec* shard() {
    shard_consumed_ = true;
    return shard_ && shard_->size > 1 ? &*shard_ : nullptr;
  }
  bool shard_consumed() const { return shard_consumed_; }
  // Tier L3: quantized layers the CPU kernels support run them (kernels/cpu/qmm.h).
  void set_cpu_kernels(bool on) { cpu_kernels_ = on; }
  bool cpu_kernels() const { return cpu_kernels_; }
  // Tier L3 of a CUDA build: quantized layers the CUDA kernel supports run it for decode-sized
  // calls (kernels/cuda/qmm.h).
  void set_cuda_kernels(bool on) { cuda_kernels_ = on; }
  bool cuda_kernels() const { return cuda_kernels_; }
  // LoRA adapters (src/lora/): the layers ask it for theirs as they load; null: none.
  void set_adapters(nn::AdapterSource* source) { adapters_ = source; }
  nn::AdapterSource* adapters() const { return adapters_; }
  // Adapters chosen per request (nn/adapter_router.h): every Linear and Embedding registers its
  // site as it loads; null: none (tensor-parallel loads).
  void set_router(std::shared_ptr<nn::AdapterRouter> router) { router_ = std::move(router); }
  const std::shared_ptr<nn::AdapterRouter>& router() const { return router_; }

 private:
  Weights weights_;
  std::optional<ShardSpec> shard_;
  bool shard_consumed_ = false;
  std::set<std::string> used_, released_;
  size_t released_bytes_ = 0;  // freed since the last trim
  QuantConfig quant_;
  std::string source_;
  bool cpu_kernels_ = false;
  bool cuda_kernels_ = false;
  nn::AdapterSource* adapters_ = nullptr;
  std::shared_ptr<nn::AdapterRouter> router_;
};

// Residual-stream states a forward records while the tap is set on a model (what a speculative
// drafter reads). Each forward overwrites the previous record; logits are unaffected.
struct HiddenTap {
  std::set<int> layers;         // decoder layers (0-based) whose output to keep
  bool final_norm = false;      // also keep the state after the final norm
  std::optional<int> position;  // keep only this position (negative: from the end), else all
  std::map<int, mx::array> layer_states;  // layer -> (B, L or 1, hidden)
  std::optional<mx::array> final_state;   // (B, L or 1, hidden)

  // Called by the models: after decoder layer `layer`, and on the final norm's output.
  void on_layer(int layer, const mx::array& h);
  void on_final(const mx::array& h);

 private:
  mx::array select(const mx::array& h) const;
};

class Model {
 public:
  virtual ~Model() = default;
  // Records hidden states into `tap` on every forward until reset with nullptr. Every model in
  // src/models supports it.
  void set_hidden_tap(HiddenTap* tap) { tap_ = tap; }
  HiddenTap* hidden_tap() const { return tap_; }
  // Tier L3 (lmx's CPU kernels), set by load_model: the token loop takes its log_softmax too.
  void set_cpu_kernels(bool on) { cpu_kernels_ = on; }
  bool cpu_kernels() const { return cpu_kernels_; }
  // tokens: (B, L) int32 -> logits (B, L, vocab).
  virtual mx::array operator()(const mx::array& tokens, Cache& cache) = 0;
  // Hidden states after the final norm, (B, L, hidden); used by embeddings.
  virtual mx::array hidden(const mx::array& tokens, Cache& cache) = 0;
  // The token embedding (B, L) -> (B, L, hidden) and the LM head on states after the final norm
  // (B, L, hidden) -> (B, L, vocab): a DFlash drafter borrows both. Dense decoders have them;
  // other architectures throw.
  virtual mx::array embed(const mx::array& tokens) const;
  virtual mx::array head(const mx::array& h) const;
  virtual Cache make_cache() const;
  virtual int num_layers() const = 0;
  // Takes a batch of independent rows (cache/rows_cache.h) in one forward. Models whose layers
  // pass K/V between them (gemma4's KV sharing) step rows one at a time instead.
  virtual bool batches_rows() const { return true; }
  // Training (src/train, gradient checkpointing): each decoder layer runs as hook(layer, x, f)
  // instead of f(x). `f` holds what it needs by value, so it may run again later (a recompute).
  // Models whose forward calls the hook return true from supports_layer_hook.
  using LayerFn = std::function<mx::array(const mx::array&)>;
  using LayerHook = std::function<mx::array(int layer, const mx::array& x, const LayerFn& f)>;
  virtual bool supports_layer_hook() const { return false; }
  void set_layer_hook(LayerHook hook) { layer_hook_ = std::move(hook); }

 protected:
  HiddenTap* tap_ = nullptr;
  LayerHook layer_hook_;

 private:
  bool cpu_kernels_ = false;
};

struct ModelInfo {
  std::string model_type;
  json config;
  std::vector<int> eos_token_ids;  // generation_config.json wins over config.json
  std::optional<int> max_position_embeddings;
};

struct LoadedWeights {
  std::unique_ptr<Model> model;
  ModelInfo info;
  bool cpu_kernels = false;   // tier L3 (quantized matmuls on lmx's CPU kernels), else L1
  bool cuda_kernels = false;  // tier L3 of a CUDA build (decode matmuls on lmx's CUDA kernel)
  std::shared_ptr<nn::AdapterRouter> router;  // per-request adapters; null with tensor parallel
};

// One registered architecture: build the model from config.json, consuming tensors.
struct Architecture {
  // Rewrites checkpoint tensors before loading (mlx-lm's Model.sanitize).
  std::function<void(const json& config, Weights& weights)> sanitize;
  std::function<std::unique_ptr<Model>(const json& config, WeightStore& weights)> build;
};

void register_architecture(const std::string& model_type, Architecture arch);
const Architecture* find_architecture(const std::string& model_type);
std::vector<std::string> registered_architectures();

// Loads config.json, generation_config.json and model*.safetensors from a directory.
// options.exact selects tier L1 (stock MLX ops, bit-exact with mlx-lm); otherwise, on the CPU,
// quantized matmuls run lmx's kernels (tier L3). With a shard spec of size > 1, only that rank's
// part of a tensor-parallel model.
LoadedWeights load_model(const std::filesystem::path& dir, const LoadOptions& options = {},
                         const std::optional<ShardSpec>& shard = std::nullopt);

// Static registration helper for one architecture file.
struct ArchitectureRegistrar {
  ArchitectureRegistrar(const std::string& model_type, Architecture arch) {
    register_architecture(model_type, std::move(arch));
  }
};

}  // namespace lmx
