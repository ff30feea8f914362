// The instantiations of qmv.cuh's lmx_qmv that the CUDA build compiles ahead of time (nvcc, for
// sm_80 and sm_90, PTX for newer chips) and embeds as a fat binary (CMakeLists.txt); qmm.cpp
// loads it once and launches these by name from its own MLX primitive.
#include "kernels/cuda/qk_rope.cuh"
#include "kernels/cuda/qmv.cuh"

#define LMX_QMV_KERNEL(TN, T, B, G, TT)                                                         \
  extern "C" __global__ void lmx_qmv_##TN##_##B##_##G##_##TT(const T* x, const unsigned int* w, \
                                                             const T* scales, const T* biases,  \
                                                             T* out, int M, int N, int K) {     \
    lmx_qmv<T, B, G, TT>(x, w, scales, biases, out, M, N, K);                                   \
  }
#define LMX_QMV_TT(TN, T, B, G)  \
  LMX_QMV_KERNEL(TN, T, B, G, 1) \
  LMX_QMV_KERNEL(TN, T, B, G, 2)
#define LMX_QMV_GS(TN, T, B) \
  LMX_QMV_TT(TN, T, B, 32)   \
  LMX_QMV_TT(TN, T, B, 64)   \
  LMX_QMV_TT(TN, T, B, 128)
#define LMX_QMV_BITS(TN, T) \
  LMX_QMV_GS(TN, T, 4)      \
  LMX_QMV_GS(TN, T, 8)

LMX_QMV_BITS(bf16, __nv_bfloat16)
LMX_QMV_BITS(f16, __half)

// The fused forms (qmv.cuh's lmx_qmv_multi and lmx_qmv_swiglu) for the layouts tier L3 routes to
// the kernel (groups 64 and 128, kernels/cuda/routing.h).
#define LMX_QMV_FUSED(TN, T, B, G, TT)                                                \
  extern "C" __global__ void lmx_qmv_multi_##TN##_##B##_##G##_##TT(LmxQmvMulti a) {   \
    lmx_qmv_multi<T, B, G, TT>(a);                                                    \
  }                                                                                   \
  extern "C" __global__ void lmx_qmv_swiglu_##TN##_##B##_##G##_##TT(LmxQmvSwiglu a) { \
    lmx_qmv_swiglu<T, B, G, TT>(a);                                                   \
  }
#define LMX_QMV_FUSED_TT(TN, T, B, G) \
  LMX_QMV_FUSED(TN, T, B, G, 1)       \
  LMX_QMV_FUSED(TN, T, B, G, 2)
#define LMX_QMV_FUSED_GS(TN, T, B) \
  LMX_QMV_FUSED_TT(TN, T, B, 64)   \
  LMX_QMV_FUSED_TT(TN, T, B, 128)
#define LMX_QMV_FUSED_BITS(TN, T) \
  LMX_QMV_FUSED_GS(TN, T, 4)      \
  LMX_QMV_FUSED_GS(TN, T, 8)

LMX_QMV_FUSED_BITS(bf16, __nv_bfloat16)
LMX_QMV_FUSED_BITS(f16, __half)

// Per-head q/k norms and RoPE of a decode step (qk_rope.cuh): dtype x head_dim.
#define LMX_QK_ROPE(TN, T, D) \
  extern "C" __global__ void lmx_qk_rope_##TN##_##D(LmxQkRope a) { lmx_qk_rope<T, D>(a); }
#define LMX_QK_ROPE_D(TN, T) \
  LMX_QK_ROPE(TN, T, 64)     \
  LMX_QK_ROPE(TN, T, 128)    \
  LMX_QK_ROPE(TN, T, 192)    \
  LMX_QK_ROPE(TN, T, 256)
LMX_QK_ROPE_D(bf16, __nv_bfloat16)
LMX_QK_ROPE_D(f16, __half)

// A dense copy of a strided array (up to 8 dimensions) with 2- or 4-byte elements, for the rare
// input that is not row-contiguous when the primitive runs.
struct LmxStrides {
  long long shape[8];
  long long strides[8];
};
template <typename E>
__device__ void lmx_dense_copy(const E* in, E* out, LmxStrides s, int ndim, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    long long rem = i, off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      off += (rem % s.shape[d]) * s.strides[d];
      rem /= s.shape[d];
    }
    out[i] = in[off];
  }
}
extern "C" __global__ void lmx_dense_copy_2(const unsigned short* in, unsigned short* out,
                                            LmxStrides s, int ndim, long long n) {
  lmx_dense_copy(in, out, s, ndim, n);
}
extern "C" __global__ void lmx_dense_copy_4(const unsigned int* in, unsigned int* out, LmxStrides s,
                                            int ndim, long long n) {
  lmx_dense_copy(in, out, s, ndim, n);
}
