// The attention inputs of a decode step in one launch (tier L3 on CUDA, kernels/cuda/qmm.h
// qk_norm_rope): per-head RMSNorm of q and k (qwen3's q_norm / k_norm, optional) and RoPE
// (mx::fast::rope, not traditional, over the whole head), written in the layout attention reads.
// The unfused layer runs four kernels here (two rms_norm, two rope), each a few microseconds of
// GPU time for a few kilobytes.
//
// q (B * L, Hq * D) and k (B * L, Hk * D) row-contiguous (the q and k projections' outputs);
// outputs (B, Hq, L, D) and (B, Hk, L, D). One warp per (row, head): lane j holds the pairs
// (i, i + D / 2) for i = j, j + 32, ... (D / 64 of them), the rotation's pairs.
//
// Rounding as the unfused ops (MLX's CUDA kernels): the norm y = x * rsqrt(mean(x^2) + eps) in
// float32, rounded to T, times the weight rounded to T; the rotation in float32 from T inputs with
// theta = scale * position * inv_freq, inv_freq = exp2(-(i / (D / 2)) * log2(base)) or 1 /
// freqs[i], rounded to T. Only the sum of squares is added in another order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

struct LmxQkRope {
  const void* q;
  const void* k;
  const void* q_weight;  // (D) or null: no norm
  const void* k_weight;
  const float* freqs;  // (D / 2) or null: base
  void* q_out;
  void* k_out;
  float eps, log2_base, scale;
  int L, Hq, Hk, offset, rows;  // rows = B * L; row m is position offset + m % L
};

template <typename T, int D>
__device__ void lmx_qk_rope(const LmxQkRope& a) {
  static_assert(D % 64 == 0 && D <= 256, "head_dim 64, 128, 192 or 256");
  constexpr int P = D / 64;  // pairs per lane
  const int warp = int((blockIdx.x * blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
  const int H = a.Hq + a.Hk;
  if (warp >= a.rows * H) return;
  const int m = warp / H, h = warp % H;
  const bool is_q = h < a.Hq;
  const int head = is_q ? h : h - a.Hq, heads = is_q ? a.Hq : a.Hk;
  const T* in = static_cast<const T*>(is_q ? a.q : a.k) + (size_t(m) * heads + head) * D;
  const T* w = static_cast<const T*>(is_q ? a.q_weight : a.k_weight);

  float x1[P], x2[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    x1[p] = float(in[lane + 32 * p]);
    x2[p] = float(in[lane + 32 * p + D / 2]);
  }
  if (w) {
    float ss = 0.0f;
#pragma unroll
    for (int p = 0; p < P; ++p) ss += x1[p] * x1[p] + x2[p] * x2[p];
#pragma unroll
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float n = rsqrtf(ss / D + a.eps);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int i = lane + 32 * p;
      x1[p] = float(T(float(w[i]) * float(T(x1[p] * n))));
      x2[p] = float(T(float(w[i + D / 2]) * float(T(x2[p] * n))));
    }
  }
  const int b = m / a.L, l = m % a.L;
  const float pos = a.scale * float(a.offset + l);
  T* out = static_cast<T*>(is_q ? a.q_out : a.k_out) + ((size_t(b) * heads + head) * a.L + l) * D;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int i = lane + 32 * p;
    const float inv_freq =
        a.freqs ? float(1.0 / double(a.freqs[i])) : exp2f(-(float(i) / float(D / 2)) * a.log2_base);
    const float theta = pos * inv_freq;
    const float c = cosf(theta), s = sinf(theta);
    out[i] = T(x1[p] * c - x2[p] * s);
    out[i + D / 2] = T(x1[p] * s + x2[p] * c);
  }
}
