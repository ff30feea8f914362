// kv_config.json (mlx-optiq, read by mlx-bun): per-layer KV-cache quantization, a JSON list of
// {"layer_idx": L, "bits": B, "group_size": G}.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "lmx/lmx.h"

namespace lmx {

// Checks every entry: layer in [0, num_caches) (the layers owning a KV cache), bits and group
// size supported by mx::quantize, no layer twice. Errors start with `where`.
void validate_kv_config(const std::vector<KVLayerBits>& config, int num_caches,
                        const std::string& where);

// Parses and validates a kv_config.json file.
std::vector<KVLayerBits> read_kv_config(const std::filesystem::path& file, int num_caches);

}  // namespace lmx
