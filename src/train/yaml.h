// The YAML subset mlx_lm.lora's `-c config.yaml` files use, read into JSON: block mappings and
// sequences by indentation, one-line flow sequences and mappings ([a, b], {k: v}), plain and
// quoted scalars, `#` comments. Scalars resolve as mlx-lm's loader does (yaml.SafeLoader plus its
// float resolver): null / ~, true / false, integers, floats including `1e-5`, else strings.
#pragma once

#include <filesystem>
#include <string>

#include "core/json.h"

namespace lmx::train {

// Throws lmx::Error naming the file and line for anything outside the subset.
json parse_yaml(const std::string& text, const std::string& source);
json read_yaml_file(const std::filesystem::path& path);

}  // namespace lmx::train
