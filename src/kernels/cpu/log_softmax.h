// log_softmax over the last axis on the CPU (tier L3): the token loop's logits - logsumexp(logits)
// in one primitive, vectorized and spread over the thread pool, where MLX's CPU logsumexp runs a
// scalar exp over the whole vocabulary on one thread.
#pragma once

#include <mlx/mlx.h>

#include <optional>

#include "kernels/cpu/qmm.h"

namespace lmx::kernels::cpu {

// x (..., V) float32/bfloat16/float16 -> x - logsumexp(x) along the last axis, in x's dtype,
// computed in float32: per chunk of kLogSoftmaxChunk values its max and sum of exp(x - max),
// merged in chunk order, so the result does not depend on the thread count. A row of only -inf
// gives NaN, as the MLX computation does. Runs on the CPU.
constexpr int kLogSoftmaxChunk = 4096;
mx::array log_softmax(const mx::array& x, std::optional<Isa> isa = std::nullopt);

// The plain-MLX computation log_softmax stands for (mlx-lm's token loop).
mx::array log_softmax_reference(const mx::array& x);

}  // namespace lmx::kernels::cpu
