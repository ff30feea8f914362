// Writing an MLX model directory the way mlx_lm.utils.save_model / save_config do.
#pragma once

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace lmx::convert {

// Keeps key order like Python dicts (config.json files are written in mlx-lm's order).
using ojson = nlohmann::ordered_json;

struct QuantParams {
  int group_size = 64;
  int bits = 4;
};
// Quantized module path (tensor prefix, e.g. "model.layers.0.mlp.up_proj") -> its parameters.
using QuantMap = std::map<std::string, QuantParams>;

// Tensor names in model order: embeddings, then layers by number, then the rest (numbers inside
// names compare numerically). Shards are filled in this order.
std::vector<std::string> ordered_names(const Weights& weights);

// mlx-lm `get_total_parameters`: a quantized module counts weight.size * 32 / bits (+ bias); the
// parameters of non-leaf modules (the hybrids' A_log and dt_bias, gpt_oss's sinks) are not counted.
int64_t total_parameters(const Weights& weights, const QuantMap& quantized);

// Writes model.safetensors, or model-0000k-of-0000n.safetensors shards of at most
// `max_shard_bytes` (mlx-lm: 5 GiB), and model.safetensors.index.json (always, as mlx-lm does).
// Arrays are evaluated one shard at a time.
// With `progress`, a progress line on stderr (core/progress.h) over the bytes computed and written.
void save_weights(const std::filesystem::path& dir, const Weights& weights,
                  const QuantMap& quantized, uint64_t max_shard_bytes = 5ull << 30,
                  bool progress = false);

// mlx-lm `save_config`: drops _name_or_path and vision_config, mirrors quantization into
// quantization_config, sorts the top-level keys, writes with indent 4 and ASCII escapes.
void save_config(const std::filesystem::path& path, ojson config);

// The `quantization` block: {"group_size", "bits", "mode": "affine"} plus per-module overrides.
ojson quantization_block(const QuantParams& defaults, const QuantMap& overrides = {});

void write_json(const std::filesystem::path& path, const ojson& j, int indent = 2,
                bool ensure_ascii = false);
ojson read_ojson(const std::filesystem::path& path);

// A destination directory written under "<dst>.partial" and renamed into place by commit(); an
// uncommitted one is removed, so a failed conversion leaves nothing at `dst`.
class StagingDir {
 public:
  explicit StagingDir(const std::filesystem::path& dst);
  ~StagingDir();
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  const std::filesystem::path& path() const { return tmp_; }
  void commit();

 private:
  std::filesystem::path dst_, tmp_;
  bool committed_ = false;
};

}  // namespace lmx::convert
