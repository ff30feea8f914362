// Helpers shared by the HF and GGUF converters.
#pragma once

#include <mlx/mlx.h>

#include <optional>
#include <string>

namespace lmx::convert {

namespace mx = mlx::core;

// float16 | bfloat16 | float32; nullopt for anything else.
std::optional<mx::Dtype> parse_dtype(const std::string& name);
std::string dtype_label(mx::Dtype dtype);  // "float16" ...

// bits in {2,3,4,5,6,8}, group size in {32,64,128} (mx::quantize's affine mode).
void check_quant_params(int bits, int group_size);

bool ends_with(const std::string& s, const std::string& suffix);
bool starts_with(const std::string& s, const std::string& prefix);

}  // namespace lmx::convert
