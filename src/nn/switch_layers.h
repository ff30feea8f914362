// mlx-lm's switch_layers.py: per-expert linear layers through gather_mm / gather_qmm, and
// SwitchGLU, which sorts the (token, expert) pairs by expert once there are 64 or more.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "nn/layers.h"

namespace lmx::nn {

// SwitchLinear or QuantizedSwitchLinear: weight (experts, out, in), or packed with scales and
// biases (experts, out, in / group_size); bias (experts, out).
struct SwitchLinear {
  mx::array weight{0.0f};
  std::optional<mx::array> scales, biases, bias;
  std::optional<QuantSpec> quant;
  bool cpu_kernel = false;  // tier L3: the experts run kernels/cpu/gather_qmm.h
  bool from_mxfp4 = false;  // tier L3: MXFP4 experts held widened (nn/layers.h widen_mxfp4_weight)
  std::vector<std::shared_ptr<const SwitchAdapter>> adapters;

  static SwitchLinear load(WeightStore& w, const std::string& path, int in, int out, int experts,
                           bool has_bias);
  // x (..., 1, in) rows, indices (...) expert ids -> (..., 1, out).
  mx::array operator()(const mx::array& x, const mx::array& indices, bool sorted_indices) const;
};

// The k experts of highest score per token, in argpartition's order: mlx-lm's
// argpartition(scores, kth=-k, axis=-1)[..., -k:]. scores (..., E) -> (..., k).
mx::array top_k_experts(const mx::array& scores, int k);

struct SwitchGLU {
  SwitchLinear gate_proj, up_proj, down_proj;
  // activation(x_up, x_gate); SwiGLU (swiglu(gate, x_up)) by default.
  std::function<mx::array(const mx::array&, const mx::array&)> activation;

  static SwitchGLU load(WeightStore& w, const std::string& path, int dims, int hidden, int experts,
                        bool bias);
  // x (B, L, dims), indices (B, L, k) -> (B, L, k, dims)
  mx::array operator()(const mx::array& x, const mx::array& indices) const;
};

}  // namespace lmx::nn
