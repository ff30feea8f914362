// The instantiations of rows_attention.cuh that the CUDA build compiles ahead of time (nvcc) and
// embeds as a fat binary (CMakeLists.txt); rows_attention.cpp loads it once and launches these by
// name from its MLX primitive. Names: lmx_rows_attn_<dtype>_<D>_<GB>,
// lmx_rows_attn_reduce_<dtype>_<D>.
#include "kernels/cuda/rows_attention.cuh"

#define LMX_ROWS_ATTN(TN, T, D, GB)                                                \
  extern "C" __global__ void __launch_bounds__(128)                                \
      lmx_rows_attn_##TN##_##D##_##GB(const __grid_constant__ LmxRowsAttnArgs a) { \
    lmx_rows_attn<T, D, GB>(a);                                                    \
  }
#define LMX_ROWS_REDUCE(TN, T, D)                             \
  extern "C" __global__ void lmx_rows_attn_reduce_##TN##_##D( \
      const __grid_constant__ LmxRowsAttnArgs a) {            \
    lmx_rows_attn_reduce<T, D>(a);                            \
  }
#define LMX_ROWS_D(TN, T, D) \
  LMX_ROWS_ATTN(TN, T, D, 1) \
  LMX_ROWS_ATTN(TN, T, D, 2) \
  LMX_ROWS_ATTN(TN, T, D, 4) \
  LMX_ROWS_REDUCE(TN, T, D)
#define LMX_ROWS_T(TN, T) \
  LMX_ROWS_D(TN, T, 64)   \
  LMX_ROWS_D(TN, T, 128)  \
  LMX_ROWS_D(TN, T, 256)

LMX_ROWS_T(bf16, __nv_bfloat16)
LMX_ROWS_T(f16, __half)
LMX_ROWS_T(f32, float)

extern "C" __global__ void lmx_rows_copy16(const uint4* in, uint4* out, long long n16) {
  lmx_rows_copy(in, out, n16);
}
