// The experts of a MoE layer on the L3 kernels: mx::gather_qmm(x, w, scales, biases,
// rhs_indices = indices, transpose = true) for affine weights, each (token, expert) pair's rows
// through the quantized-matmul kernel of that expert's weight (qmm.h), all experts of a call in
// one parallel_for.
#pragma once

#include <mlx/mlx.h>

#include "kernels/cpu/qmm.h"

namespace lmx::kernels::cpu {

namespace mx = mlx::core;

// x (..., M, K) float32/bfloat16/float16; w (E, N, K * bits / 32) uint32; scales, biases (E, N,
// K / gs); indices (...) integer expert ids. Returns (broadcast(x.shape[:-2], indices.shape), M,
// N) as mx::gather_qmm with no lhs_indices; the rows of each expert run together, whether or not
// the indices are sorted. Rows of an expert id outside [0, E) are zeros. Runs on the CPU.
mx::array gather_quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                                  const mx::array& biases, const mx::array& indices,
                                  const QmmOptions& opt);

// Each expert's packed copy (qmm.h prepack) made now, at load, where the calls will use it.
void prepack_experts(const mx::array& w, const mx::array& scales, const mx::array& biases,
                     int group_size, int bits);

// Whether a load at L3 puts affine experts on this kernel: LMX_CPU_MOE=0|1 (unset: 1; 0 keeps
// them on mx::gather_qmm, for A/B runs). A bad value is an error.
bool moe_experts();

}  // namespace lmx::kernels::cpu
