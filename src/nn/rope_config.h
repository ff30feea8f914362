// A model's RoPE from its config: rope_theta and rope_scaling at the top level, or nested under
// rope_parameters as transformers >= 5 writes them.
#pragma once

#include <optional>

#include "core/error.h"
#include "core/json.h"
#include "nn/layers.h"

namespace lmx::nn {

inline RoPE rope_from_config(const JsonView& v, int dims, std::optional<int> max_position) {
  const json& c = v.j;
  std::optional<float> theta = v.get_opt<float>("rope_theta");
  json scaling = v.has("rope_scaling") ? c["rope_scaling"] : json();
  if (v.has("rope_parameters") && c["rope_parameters"].is_object()) {
    const json& rp = c["rope_parameters"];
    if (!theta && rp.contains("rope_theta")) theta = rp["rope_theta"].get<float>();
    if (scaling.is_null()) scaling = rp;
  }
  check(theta.has_value(), v.source, "rope_theta is missing from the model config");
  return make_rope(dims, *theta, false, scaling, max_position, v.source);
}

}  // namespace lmx::nn
