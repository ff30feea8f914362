// Decode attention of B independent rows over their own KV caches, in one launch per layer (tier
// L3 of the CUDA build; the host side is rows_attention.cpp, the contract that of
// kernels::cpu::rows_decode_attention). Row r's query (Hq heads, one position) attends over
// positions [0, len_r) of its key/value buffers (1, Hkv, cap_r, D); position len_r - 1 is the new
// key/value, read from k_new / v_new and written into the buffers by the same launch.
//
// Grid (Hq / GB, rows, splits): a block takes GB query heads of one KV head (GQA: the keys are
// read once for GB heads) over one chunk of positions; with splits > 1 each block leaves its
// partial (unnormalized sums, running max and sum of exponentials) in `part` and
// lmx_rows_attn_reduce combines them (flash-decoding). Four warps per block; a key is spread over
// LPK lanes (16 bytes each), so a warp holds 32 / LPK keys at a time, two such sets in flight.
// Scores in float32 (exp2 with the scale folded into q), output rounded once to T.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include "kernels/cuda/rows_attention_args.h"

template <typename T>
__device__ __forceinline__ float lmx_to_f(T x);
template <>
__device__ __forceinline__ float lmx_to_f(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float lmx_to_f(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float lmx_to_f(float x) {
  return x;
}
template <typename T>
__device__ __forceinline__ T lmx_from_f(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 lmx_from_f(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __forceinline__ __half lmx_from_f(float x) {
  return __float2half(x);
}
template <>
__device__ __forceinline__ float lmx_from_f(float x) {
  return x;
}

template <typename T, int D>
struct LmxRowsAttnShape {
  static constexpr int VEC = 16 / sizeof(T);               // elements per 16-byte load
  static constexpr int LPK = D / VEC < 32 ? D / VEC : 32;  // lanes per key
  static constexpr int EPL = D / LPK;                      // elements per lane
  static constexpr int NV = EPL / VEC;                     // 16-byte loads per lane and key
  static constexpr int KPW = 32 / LPK;                     // keys per warp and set
  static constexpr int NW = 4;                             // warps per block
  static constexpr int U = 2;                              // sets in flight per warp
};

template <typename T, int EPL>
__device__ __forceinline__ void lmx_unpack(const uint4* raw, float* f) {
  const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
  for (int i = 0; i < EPL; ++i) f[i] = lmx_to_f<T>(e[i]);
}

template <typename T, int D, int GB>
__device__ void lmx_rows_attn(const LmxRowsAttnArgs& a) {
  using S = LmxRowsAttnShape<T, D>;
  constexpr int LPK = S::LPK, EPL = S::EPL, NV = S::NV, KPW = S::KPW, NW = S::NW, U = S::U;
  __shared__ float s_acc[NW][GB][D];
  __shared__ float s_m[NW][GB], s_l[NW][GB];

  const int r = blockIdx.y, split = blockIdx.z;
  const LmxRowsAttnRow row = a.rows[r];
  const int begin = split * a.chunk;
  if (begin >= row.len) return;  // this row has fewer splits; the reduce reads only its own
  const int end = min(row.len, begin + a.chunk);
  const int G = a.Hq / a.Hkv, h0 = blockIdx.x * GB, kvh = h0 / G;
  const bool writer = h0 % G == 0;  // one block per KV head writes the new position
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slot = lane / LPK, e0 = (lane % LPK) * EPL;

  float q[GB][EPL];
#pragma unroll
  for (int g = 0; g < GB; ++g) {
    const T* qp = static_cast<const T*>(a.q) + ((size_t)r * a.Hq + h0 + g) * D + e0;
    uint4 raw[NV];
#pragma unroll
    for (int v = 0; v < NV; ++v) raw[v] = reinterpret_cast<const uint4*>(qp)[v];
    lmx_unpack<T, EPL>(raw, q[g]);
#pragma unroll
    for (int i = 0; i < EPL; ++i) q[g][i] *= a.scale_log2;
  }
  float acc[GB][EPL], m[GB], l[GB];
#pragma unroll
  for (int g = 0; g < GB; ++g) {
    m[g] = -CUDART_INF_F;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < EPL; ++i) acc[g][i] = 0.f;
  }

  const size_t head = (size_t)kvh * row.cap * D;
  T* kb = static_cast<T*>(row.k) + head;
  T* vb = static_cast<T*>(row.v) + head;
  const size_t new_off = ((size_t)r * a.Hkv + kvh) * D + e0;
  const T* kn = static_cast<const T*>(a.k_new) + new_off;
  const T* vn = static_cast<const T*>(a.v_new) + new_off;
  const int last = row.len - 1;

  for (int p0 = begin + warp * KPW * U; p0 < end; p0 += NW * KPW * U) {
    uint4 kr[U][NV], vr[U][NV];
    int pos[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      pos[u] = p0 + u * KPW + slot;
      if (pos[u] < end) {
        const T* ks = pos[u] == last ? kn : kb + (size_t)pos[u] * D + e0;
        const T* vs = pos[u] == last ? vn : vb + (size_t)pos[u] * D + e0;
#pragma unroll
        for (int v = 0; v < NV; ++v) {
          kr[u][v] = reinterpret_cast<const uint4*>(ks)[v];
          vr[u][v] = reinterpret_cast<const uint4*>(vs)[v];
        }
      } else {  // zeros, not stale registers: the weight 0 must not meet a NaN
#pragma unroll
        for (int v = 0; v < NV; ++v) kr[u][v] = vr[u][v] = make_uint4(0, 0, 0, 0);
      }
    }
    float sc[U][GB];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[EPL];
      lmx_unpack<T, EPL>(kr[u], kf);
#pragma unroll
      for (int g = 0; g < GB; ++g) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < EPL; ++i) s = fmaf(q[g][i], kf[i], s);
#pragma unroll
        for (int o = LPK / 2; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
        sc[u][g] = pos[u] < end ? s : -CUDART_INF_F;
      }
      if (writer && pos[u] == last) {
#pragma unroll
        for (int v = 0; v < NV; ++v) {
          reinterpret_cast<uint4*>(kb + (size_t)last * D + e0)[v] = kr[u][v];
          reinterpret_cast<uint4*>(vb + (size_t)last * D + e0)[v] = vr[u][v];
        }
      }
    }
    // Online softmax: sc becomes each position's weight against the new running max.
#pragma unroll
    for (int g = 0; g < GB; ++g) {
      float mn = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u) mn = fmaxf(mn, sc[u][g]);
      if (mn == -CUDART_INF_F) {  // no position of this slot yet
#pragma unroll
        for (int u = 0; u < U; ++u) sc[u][g] = 0.f;
        continue;
      }
      const float c = exp2f(m[g] - mn);
      l[g] *= c;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        sc[u][g] = exp2f(sc[u][g] - mn);
        l[g] += sc[u][g];
      }
#pragma unroll
      for (int i = 0; i < EPL; ++i) acc[g][i] *= c;
      m[g] = mn;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float vf[EPL];
      lmx_unpack<T, EPL>(vr[u], vf);
#pragma unroll
      for (int g = 0; g < GB; ++g) {
#pragma unroll
        for (int i = 0; i < EPL; ++i) acc[g][i] = fmaf(sc[u][g], vf[i], acc[g][i]);
      }
    }
  }

  // The warp's key slots, then the block's warps.
#pragma unroll
  for (int o = LPK; o < 32; o *= 2) {
#pragma unroll
    for (int g = 0; g < GB; ++g) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[g], o);
      const float lo = __shfl_xor_sync(0xffffffffu, l[g], o);
      const float mn = fmaxf(m[g], mo);
      const float c1 = mn == -CUDART_INF_F ? 0.f : exp2f(m[g] - mn);
      const float c2 = mn == -CUDART_INF_F ? 0.f : exp2f(mo - mn);
      l[g] = l[g] * c1 + lo * c2;
#pragma unroll
      for (int i = 0; i < EPL; ++i) {
        const float ao = __shfl_xor_sync(0xffffffffu, acc[g][i], o);
        acc[g][i] = acc[g][i] * c1 + ao * c2;
      }
      m[g] = mn;
    }
  }
  if (slot == 0) {
#pragma unroll
    for (int g = 0; g < GB; ++g) {
#pragma unroll
      for (int i = 0; i < EPL; ++i) s_acc[warp][g][e0 + i] = acc[g][i];
      if (lane == 0) {
        s_m[warp][g] = m[g];
        s_l[warp][g] = l[g];
      }
    }
  }
  __syncthreads();
  for (int t = threadIdx.x; t < GB * D; t += NW * 32) {
    const int g = t / D, d = t % D;
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < NW; ++w) mx = fmaxf(mx, s_m[w][g]);
    float sum = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float c = s_m[w][g] == -CUDART_INF_F ? 0.f : exp2f(s_m[w][g] - mx);
      sum += s_l[w][g] * c;
      o += s_acc[w][g][d] * c;
    }
    const size_t qh = (size_t)r * a.Hq + h0 + g;
    if (a.part == nullptr) {
      static_cast<T*>(a.out)[qh * D + d] = lmx_from_f<T>(o / sum);
    } else {
      float* p = a.part + (qh * a.splits + split) * (D + 2);
      p[d] = o;
      if (d == 0) {
        p[D] = mx;
        p[D + 1] = sum;
      }
    }
  }
}

// Combines the splits of lmx_rows_attn: grid (Hq, n), D threads.
template <typename T, int D>
__device__ void lmx_rows_attn_reduce(const LmxRowsAttnArgs& a) {
  const int h = blockIdx.x, r = blockIdx.y, d = threadIdx.x;
  const int ns = (a.rows[r].len + a.chunk - 1) / a.chunk;
  const size_t qh = (size_t)r * a.Hq + h;
  const float* p = a.part + qh * a.splits * (D + 2);
  float mx = -CUDART_INF_F;
  for (int s = 0; s < ns; ++s) mx = fmaxf(mx, p[s * (D + 2) + D]);
  float sum = 0.f, o = 0.f;
  for (int s = 0; s < ns; ++s) {
    const float c = exp2f(p[s * (D + 2) + D] - mx);
    sum += p[s * (D + 2) + D + 1] * c;
    o += p[s * (D + 2) + d] * c;
  }
  static_cast<T*>(a.out)[qh * D + d] = lmx_from_f<T>(o / sum);
}

// A whole buffer copied (16-byte words; `n16` of them), for a row whose cache cannot vouch that
// its buffers are its own (KVCache::reserve's in_place = false).
__device__ inline void lmx_rows_copy(const uint4* in, uint4* out, long long n16) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n16;
       i += (long long)gridDim.x * blockDim.x)
    out[i] = in[i];
}
