// Which layouts tier L3 on the GPU routes to lmx's CUDA kernel (kernels/cuda/qmm.h), given that
// the kernel supports them: those whose GPU tier gates passed (tests/models/test_cuda_tiers.cpp).
// Group size 32 did not (a 4-bit g32 row: top-1 98.2% against L1, greedy identical on 1 of 4
// prompts; docs/gpu.md) and stays on mx::quantized_matmul; the kernel itself still takes it.
#pragma once

namespace lmx::kernels::cuda {

bool routed(int bits, int group_size);

// The rows decode attention kernel (rows_attention.h) in batched decode steps of tier L3: only
// with LMX_CUDA_ROWS=1 until a benchmark shows it faster than the per-row path (its gates passed
// on an H100 on tiny rows; its speed is not measured yet: docs/gpu.md).
bool rows_routed();

}  // namespace lmx::kernels::cuda
