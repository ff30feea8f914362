// Plain arguments of the per-ISA quantized-matmul kernels (no library types: the ISA files
// include nothing that could be compiled for a wider ISA than the CPU has).
#pragma once

namespace lmx::kernels::cpu {

enum class ScaleType { f32, bf16, f16 };

struct QmmArgs {
  // (M, K) float32. For bits == 4 each block of 32 inputs is reordered as the even elements then
  // the odd ones, the order in which the kernel unpacks low and high nibbles.
  const float* x = nullptr;
  const unsigned char* w = nullptr;  // (N, K * bits / 8): MLX's packing, LSB first
  const void* scales = nullptr;      // (N, K / group_size)
  const void* biases = nullptr;      // (N, K / group_size)
  ScaleType scale_type = ScaleType::f32;
  float* out = nullptr;  // (M, N) float32
  int M = 0, N = 0, K = 0, group_size = 0, bits = 0;
};

// Rows [n0, n1) of the output for every m; wbuf: 4 * K floats of scratch.
using QmmRowsFn = void (*)(const QmmArgs& a, int n0, int n1, float* wbuf);

// out (D) = softmax(scale * K q) V over S rows of K and V (row stride D); scores: S floats.
using AttnRowFn = void (*)(const float* q, const float* K, const float* V, int S, int D,
                           float scale, float* scores, float* out);

struct IsaKernels {
  QmmRowsFn qmm_rows = nullptr;
  AttnRowFn attn_row = nullptr;
};

IsaKernels kernels_generic();
IsaKernels kernels_avx2();    // empty when not built for x86-64
IsaKernels kernels_avx512();  // empty when not built for x86-64

}  // namespace lmx::kernels::cpu
