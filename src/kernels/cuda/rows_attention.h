// Decode attention of B independent rows (continuous batching) over their own KV caches on an
// NVIDIA GPU, in one kernel launch per layer (tier L3 of the CUDA build; the CPU's is
// kernels::cpu::rows_decode_attention, with the same contract). The kernel is compiled ahead of
// time by nvcc (rows_attention.cuh, rows_attention_kernels.cu) and launched by an MLX primitive of
// lmx's own, as the quantized GEMV (qmm.h).
#pragma once

#include <mlx/mlx.h>

#include <optional>
#include <vector>

namespace lmx::kernels::cuda {

namespace mx = mlx::core;

// Whether the kernel takes these shapes: q, k and v of one dtype (bfloat16, float16 or float32),
// head_dim 64, 128 or 256, n_q_heads a multiple of n_kv_heads; and a CUDA build on the GPU.
bool rows_attention_supports(mx::Dtype dtype, int head_dim, int n_q_heads, int n_kv_heads);

// Row b's new key and value (k_new, v_new (B, Hkv, 1, D), row b) are written at position
// offsets[b] of keys[b], values[b] ((1, Hkv, capacity_b, D)), and its query (q (B, Hq, 1, D),
// row b) attends over positions [0, offsets[b]] with `scale`. Returns the output (B, Hq, 1, D) in
// q's dtype, then each row's key and value buffers: written where they lie when in_place[b]
// (KVCache::reserve's word), else copies. Buffers of another dtype than q are converted first.
// `prefill` fills the output before the kernel runs (tests: every element must be written).
std::vector<mx::array> rows_decode_attention(const mx::array& q, const mx::array& k_new,
                                             const mx::array& v_new,
                                             const std::vector<mx::array>& keys,
                                             const std::vector<mx::array>& values,
                                             const std::vector<int>& offsets,
                                             const std::vector<bool>& in_place, float scale,
                                             std::optional<float> prefill = std::nullopt);

// How many primitives rows_decode_attention has made in this process (tests: a batched decode
// took the kernel, or did not).
long long rows_attention_calls();

}  // namespace lmx::kernels::cuda
