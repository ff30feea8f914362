// mlx_lm/models/gated_delta.py: the gated delta rule of the Qwen3-Next / Qwen3.5 linear-attention
// layers, in mlx-lm's ops order (its CPU path; the Metal kernels are Metal-only): compiled
// (shapeless) decay g, per-token recurrent steps compiled as mlx-lm compiles them.
#pragma once

#include <optional>
#include <utility>

#include "nn/layers.h"

namespace lmx::nn {

// compute_g: exp(-exp(A_log as float32) * softplus(a + dt_bias)), float32.
mx::array compute_g(const mx::array& A_log, const mx::array& a, const mx::array& dt_bias);

// normalize_qk: L2-normalised q and k with the Dk^-0.5 readout scale folded into q (rms_norm
// with eps * inv_scale^2, then q * inv_scale^2 and k * inv_scale).
std::pair<mx::array, mx::array> normalize_qk(const mx::array& q, const mx::array& k,
                                             double inv_scale, double eps);

// gated_delta_ops: q, k (B, T, Hk, Dk), v (B, T, Hv, Dv), g and beta (B, T, Hv), state
// (B, Hv, Dv, Dk) float32, mask (B, T) bool or none -> y (B, T, Hv, Dv) in q's dtype, new state.
std::pair<mx::array, mx::array> gated_delta_ops(mx::array q, mx::array k, const mx::array& v,
                                                const mx::array& g, const mx::array& beta,
                                                mx::array state,
                                                const std::optional<mx::array>& mask);

// gated_delta_update: beta = sigmoid(b), g = compute_g, a zero float32 state when none, then the
// recurrence.
std::pair<mx::array, mx::array> gated_delta_update(const mx::array& q, const mx::array& k,
                                                   const mx::array& v, const mx::array& a,
                                                   const mx::array& b, const mx::array& A_log,
                                                   const mx::array& dt_bias,
                                                   std::optional<mx::array> state,
                                                   const std::optional<mx::array>& mask);

// activations.precise_swiglu (compiled, shapeless): silu(gate as float32) * (x as float32), cast
// to h's dtype.
mx::array precise_swiglu(const mx::array& h, const mx::array& gate, const mx::array& x);

// mlx.nn.silu (compiled, shapeless): x * sigmoid(x).
mx::array silu(const mx::array& x);

}  // namespace lmx::nn
