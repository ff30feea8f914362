// Which layouts tier L3 on the GPU routes to lmx's CUDA kernel (kernels/cuda/qmm.h), given that
// the kernel supports them: those whose GPU tier gates passed (tests/models/test_cuda_tiers.cpp).
// Group size 32 did not (a 4-bit g32 row: top-1 98.2% against L1, greedy identical on 1 of 4
// prompts; docs/gpu.md) and stays on mx::quantized_matmul; the kernel itself still takes it.
#pragma once

namespace lmx::kernels::cuda {

bool routed(int bits, int group_size);

// The rows decode attention kernel (rows_attention.h) in batched decode steps of tier L3: on unless
// LMX_CUDA_ROWS=0 (read once; other values an error). On an H100 a Qwen3-4B 4-bit step of 8 rows
// ran 2.4x the per-row MLX path (docs/benchmarks.md); its gates: docs/gpu.md.
bool rows_routed();

// The fused decode kernels (qmm.h's qmv_multi, qmv_add, qmv_swiglu) in the dense decoder's layers
// at tier L3: on unless LMX_CUDA_FUSED=0 (read once; other values an error), which keeps one
// kernel per projection, for comparing the two in one benchmark call.
bool fused_routed();

// The pre-attention and pre-MLP RMSNorms folded into those fused kernels (qmm.h FusedNorm): on
// unless LMX_CUDA_NORM_FOLD=0 (read once; other values an error).
bool norm_fold_routed();

}  // namespace lmx::kernels::cuda
