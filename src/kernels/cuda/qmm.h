// Quantized matmul for MLX affine weights on NVIDIA GPUs (tier L3 of the CUDA build): decode-sized
// calls (1 to kMaxRows rows) run lmx's tensor-core kernel (kernels/cuda/qmv.cuh, compiled ahead
// of time by nvcc and launched by an MLX primitive of lmx's own; LMX_CUDA_QMV_JIT=1 compiles it
// with NVRTC through mx::fast::cuda_kernel instead, for comparison); every other call is
// mx::quantized_matmul.
#pragma once

#include <mlx/mlx.h>

#include <optional>
#include <string>
#include <vector>

namespace lmx::kernels::cuda {

namespace mx = mlx::core;

constexpr int kMaxRows = 16;
// Calls of kMaxRows + 1 to kChunkedRows rows (batched decode) run the kernel in slices of
// kMaxRows rows; more rows (prefill) run mx::quantized_matmul.
constexpr int kChunkedRows = 64;

// Whether the kernel can run in this process: a CUDA build whose default device is the GPU.
bool available();

// Tier L3's CUDA kernel is the GPU default; LMX_CUDA_KERNELS=0 turns it off (read once; 1 or unset:
// on, other values an error naming the variable), --exact keeps L1. Qwen3-4B 4-bit decode 1.2-1.3x
// L1 on an H100 (docs/benchmarks.md); layouts routed to it: routing.h. GPU gates: docs/gpu.md.
bool enabled();

// Whether the kernel handles this layer's layout: affine mode, 4 or 8 bits, groups 32/64/128,
// bfloat16 or float16 scales, N (output features) a multiple of 16, K (inputs) of 128.
bool supports(int bits, int group_size, const std::string& mode, mx::Dtype scale_dtype, int N,
              int K);

struct QmmOptions {
  int group_size = 64;
  int bits = 4;
};

// x (..., K), w (N, K * bits / 32) uint32, scales and biases (N, K / group_size): the result of
// mx::quantized_matmul(x, w, scales, biases, transpose = true, ...), (..., N) in the result type
// of x and the scales. The kernel runs where x has at most kMaxRows rows and the dtype of the
// scales (bfloat16 or float16), supports() holds and the default device is the GPU; otherwise
// this is mx::quantized_matmul. The kernel rounds each dequantized weight to that dtype and
// accumulates in float32.
mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, const QmmOptions& opt);

// Whether quantized_matmul runs the kernel (not mx::quantized_matmul) for these arguments.
bool takes_kernel(const mx::array& x, const mx::array& w, const mx::array& scales,
                  const QmmOptions& opt);

// The kernel alone (no fallback): an error for arguments it does not take. For tests and
// benchmarks; `prefill` fills the output before the kernel runs (a test sees every element the
// kernel leaves unwritten). Inputs that are not row-contiguous when it runs are copied densely
// first (on the GPU, by the fat binary's copy kernel).
mx::array qmv(const mx::array& x, const mx::array& w, const mx::array& scales,
              const mx::array& biases, const QmmOptions& opt,
              std::optional<float> prefill = std::nullopt);

// A quantized weight in MLX's affine layout: w (N, K * bits / 32) uint32, scales and biases
// (N, K / group_size).
struct QMatrix {
  mx::array w, scales, biases;
};

// Whether the fused calls below run lmx's kernel for x and these weights: takes_kernel holds for
// each (at most kMaxRows rows), the group size is routed (routing.h) and every weight has x's K.
// Where it does not, callers run the matmuls one by one.
bool takes_fused(const mx::array& x, const std::vector<QMatrix>& mats, const QmmOptions& opt);

// An RMSNorm of x fused into the matmuls that read it: weight (K) of x's dtype. The kernel
// multiplies x by the weight (rounded to x's dtype) before the products and the float32 sums by
// rsqrt(mean(x^2) + eps) after them, where the unfused norm rounds x * rsqrt(...) first: the
// same value, each rounding in another place.
struct FusedNorm {
  mx::array weight;
  float eps = 1e-6f;
};

// x @ dequantize(m).T for each of one to three weights of x's K in one launch (a layer's q, k and
// v projections): each output is bit for bit that of its own quantized_matmul call (without
// `norm`; with it, of norm(x)'s, up to the norm's roundings).
std::vector<mx::array> qmv_multi(const mx::array& x, const std::vector<QMatrix>& mats,
                                 const QmmOptions& opt,
                                 const std::optional<FusedNorm>& norm = std::nullopt);

// residual + x @ dequantize(m).T in one launch, residual (..., N) of x's dtype: bit for bit
// mx::add(residual, quantized_matmul(x, m)) (the product rounded to x's dtype, then the sum).
mx::array qmv_add(const mx::array& x, const QMatrix& m, const mx::array& residual,
                  const QmmOptions& opt);

// silu(x @ gate.T) * (x @ up.T) in one launch, gate and up (N, K): each product rounded to x's
// dtype, then sigmoid, g * sigmoid and the product with u each rounded, as the unfused ops.
mx::array qmv_swiglu(const mx::array& x, const QMatrix& gate, const QMatrix& up,
                     const QmmOptions& opt, const std::optional<FusedNorm>& norm = std::nullopt);

// Per-head RMSNorm (optional) and RoPE of a decode step's q and k in one launch (qk_rope.cuh):
// q (B, L, n_heads * head_dim), k (B, L, n_kv_heads * head_dim) -> (B, n_heads, L, head_dim) and
// (B, n_kv_heads, L, head_dim), row l at position offset + l. The unfused ops: per head
// mx::fast::rms_norm(x, weight, eps), then the transpose and mx::fast::rope(x, head_dim,
// traditional = false, base, scale, offset, freqs); the same roundings, the sum of squares
// added in another order.
struct QkRopeOptions {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float eps = 1e-6f;  // the norms' (with weights)
  float base = 10000.0f;
  float scale = 1.0f;
  int offset = 0;
  bool norm = false, freqs = false;  // set by qk_norm_rope from its arguments
};

// Whether qk_norm_rope takes these: the GPU with tier L3's kernels on, bfloat16 or float16,
// head_dim 64/128/192/256, at most kMaxRows positions.
bool takes_qk_norm_rope(const mx::array& q, const mx::array& k, const QkRopeOptions& opt);

// q_weight and k_weight (head_dim) of q's dtype, both or neither; freqs (head_dim / 2) float32
// replaces base as in mx::fast::rope. An error for arguments takes_qk_norm_rope refuses.
std::vector<mx::array> qk_norm_rope(const mx::array& q, const mx::array& k,
                                    const std::optional<mx::array>& q_weight,
                                    const std::optional<mx::array>& k_weight,
                                    const std::optional<mx::array>& freqs,
                                    const QkRopeOptions& opt);

// The kernel's source (qmv.cuh, embedded at build time) and the body that calls it.
const char* kernel_source();
const char* kernel_body();

}  // namespace lmx::kernels::cuda
