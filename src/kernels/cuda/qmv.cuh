// lmx quantized matmul for decode (1 to 16 rows) on NVIDIA GPUs (sm_80+), MLX affine layout.
// Compiled ahead of time by nvcc (qmv_kernels.cu, embedded as a fat binary and launched by
// qmm.cpp's MLX primitive), and at run time by NVRTC through mlx::core::fast::cuda_kernel
// (qmm.cpp with LMX_CUDA_QMV_JIT=1, bench/gpu/qmv_bench.py): there it is the `header`, the body
//   lmx_qmv<T, BITS, GS, TT>(x, w, scales, biases, out, lmx_qmv_rows(x_shape, x_ndim), w_shape[0],
//                            x_shape[x_ndim - 1]);
//
// out (M, N) = x (M, K) @ dequantize(w, scales, biases).T, with w (N, K * BITS / 32) uint32 in
// MLX's order (value k of a row at bits [BITS * (k % (32 / BITS)), +BITS) of word k / (32 / BITS)),
// scales and biases (N, K / GS) of T, x and out of T (bfloat16 or float16).
//
// Tensor cores do the dot products: out.T = W x.T as mma m16n8k16 with the weights as the
// 16 x 16 A operand (16 output features) and x as the 16 x 8 B operand (8 rows; TT = 2 tiles
// for 9 to 16 rows), so 16 rows cost about as much as one: the kernel streams the weights once
// either way. Weights are dequantized in registers to T (one rounding of s * q + b, as MLX's
// tensor-core kernels), accumulated in float32.
//
// A block of WARPS warps owns 16 output features; each warp takes every WARPS-th slice of 128
// inputs (split K), and the block sums the warps' partial tiles in shared memory. Within a slice,
// lane (g = lane / 4, t = lane % 4) loads 32 consecutive inputs of features g and g + 8 (16 bytes
// at 4 bits), and x's inputs are assigned to the mma's k slots in the same permuted order as the
// weights' (a dot product does not care about the order of its terms).
//
// Fused forms for the decode layer (below lmx_qmv): lmx_qmv_multi (up to three weights of one x,
// each output as its own lmx_qmv; or one weight plus a residual) and lmx_qmv_swiglu (gate and up
// with SiLU), each one launch where the unfused layer has two to four.
//
// Requires: K % 128 == 0, N % 16 == 0, 1 <= M <= 8 * TT, GS in {32, 64, 128}, BITS in {4, 8}.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace lmx_qmv_detail {

using u32 = unsigned int;  // uint32_t where MLX's JIT header defines it; NVRTC has no <stdint.h>

// Warps per block (splitting K; the launch passes 32 * LMX_QMV_WARPS threads) and slices of
// 128 inputs whose weights each warp has in flight at once. Overridable for the microbenchmark's
// variants (bench/gpu/qmv_bench.py --variants).
#ifndef LMX_QMV_WARPS
#define LMX_QMV_WARPS 8
#endif
#ifndef LMX_QMV_UNROLL
#define LMX_QMV_UNROLL 4
#endif
constexpr int kWarps = LMX_QMV_WARPS;
constexpr int kSlice = 128;  // inputs per warp step
constexpr int kUnroll = LMX_QMV_UNROLL;
// 1: each warp loads its next batch of slices while it computes the current one (partial_tile).
#ifndef LMX_QMV_PIPE
#define LMX_QMV_PIPE 0
#endif
constexpr bool kPipe = LMX_QMV_PIPE != 0;

template <typename T>
struct Ops;

template <>
struct Ops<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  // bfloat16 128.0: 128 + q is exact for q < 128, so (magic | q) - magic is q.
  static constexpr u32 kMagic = 0x43004300u;
  __device__ static u32 pack(float a, float b) {
    T2 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<u32*>(&v);
  }
  __device__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16(v); }
  // The two values of a packed pair, as float32.
  __device__ static float lo(u32 v) { return __uint_as_float(v << 16); }
  __device__ static float hi(u32 v) { return __uint_as_float(v & 0xffff0000u); }
  __device__ static void mma(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Ops<__half> {
  using T2 = __half2;
  // float16 1024.0: 1024 + q is exact for q < 1024.
  static constexpr u32 kMagic = 0x64006400u;
  __device__ static u32 pack(float a, float b) {
    T2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<u32*>(&v);
  }
  __device__ static float to_float(__half v) { return __half2float(v); }
  __device__ static __half from_float(float v) { return __float2half(v); }
  __device__ static float lo(u32 v) { return __half2float(__ushort_as_half((unsigned short)v)); }
  __device__ static float hi(u32 v) {
    return __half2float(__ushort_as_half((unsigned short)(v >> 16)));
  }
  __device__ static void mma(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <typename T>
__device__ inline u32 as_u32(typename Ops<T>::T2 v) {
  return *reinterpret_cast<u32*>(&v);
}
template <typename T>
__device__ inline typename Ops<T>::T2 as_t2(u32 v) {
  return *reinterpret_cast<typename Ops<T>::T2*>(&v);
}

// 4-bit word j of a lane's 32 inputs (k = 8j + e at nibble e) -> the A registers of mma steps
// 2j and 2j + 1 for one feature: step h gets slots (2t, 2t+1) = inputs (2h, 2h+4) and slots
// (2t+8, 2t+9) = inputs (2h+1, 2h+5) of the word.
template <typename T>
__device__ inline void dequant4(u32 word, typename Ops<T>::T2 s2, typename Ops<T>::T2 b2, u32* lo,
                                u32* hi) {
  using O = Ops<T>;
  const typename O::T2 magic = as_t2<T>(O::kMagic);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // Low half: nibble i (input i), high half: nibble i + 4 (input i + 4).
    u32 q = ((word >> (4 * i)) & 0x000F000Fu) | O::kMagic;
    typename O::T2 v = __hfma2(__hsub2(as_t2<T>(q), magic), s2, b2);
    if (i % 2 == 0)
      lo[i / 2] = as_u32<T>(v);
    else
      hi[i / 2] = as_u32<T>(v);
  }
}

// 8-bit word (k = 4j + e at byte e) -> one mma step for one feature: slots (2t, 2t+1) = inputs
// (0, 1), slots (2t+8, 2t+9) = inputs (2, 3).
template <typename T>
__device__ inline void dequant8(u32 word, float s, float b, u32& lo, u32& hi) {
  // 2^23 + q as a float32 (byte q into the mantissa of 0x4B000000), minus 2^23: q exactly.
  float q[4];
#pragma unroll
  for (int e = 0; e < 4; ++e)
    q[e] = __int_as_float(__byte_perm(word, 0x4B000000u, 0x7540 | e)) - 8388608.0f;
  lo = Ops<T>::pack(fmaf(q[0], s, b), fmaf(q[1], s, b));
  hi = Ops<T>::pack(fmaf(q[2], s, b), fmaf(q[3], s, b));
}

}  // namespace lmx_qmv_detail

// Rows of x (..., K): the product of its leading dimensions.
template <typename S>
__device__ inline int lmx_qmv_rows(const S& shape, int ndim) {
  int m = 1;
  for (int i = 0; i + 1 < ndim; ++i) m *= shape[i];
  return m;
}

namespace lmx_qmv_detail {

// Warp `wi` of `nw` (the warps of the block that share this tile) takes every nw-th slice of 128
// inputs and leaves its partial 16 x (8 TT) tile of features n0 .. n0 + 15 over x's rows in
// `part` (its own tile in shared memory); the caller syncs and sums the nw tiles.
struct NoPrologue {
  __device__ void operator()() const {}
};

// `norm` (K) or null: x's inputs multiplied by it (rounded to T) before the products, a fused
// RMSNorm's weight (its 1 / rms per row scales the sums afterwards, row_inv_rms). `pro` runs once
// per warp after the first weights are in flight (or at the end, for a warp without slices).
template <typename T, int BITS, int GS, int TT, typename Pro = NoPrologue>
__device__ inline void partial_tile(const T* __restrict__ x, const u32* __restrict__ w,
                                    const T* __restrict__ scales, const T* __restrict__ biases,
                                    int M, int K, int n0, int wi, int nw, float (*part)[8 * TT],
                                    const T* __restrict__ norm = nullptr, Pro pro = Pro()) {
  using O = Ops<T>;
  using T2 = typename O::T2;
  static_assert(BITS == 4 || BITS == 8, "BITS 4 or 8");
  static_assert(GS == 32 || GS == 64 || GS == 128, "GS 32, 64 or 128");
  static_assert(TT == 1 || TT == 2, "TT 1 or 2");
  constexpr int kLoads = BITS / 4;  // uint4 loads per feature per slice (32 inputs per lane)

  const int lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int slices = K / kSlice;
  const int words_per_row = K * BITS / 32;
  const int groups_per_row = K / GS;

  // Features g and g + 8 of this block.
  const u32* wrow[2] = {w + size_t(n0 + g) * words_per_row, w + size_t(n0 + g + 8) * words_per_row};
  const T* srow[2] = {scales + size_t(n0 + g) * groups_per_row,
                      scales + size_t(n0 + g + 8) * groups_per_row};
  const T* brow[2] = {biases + size_t(n0 + g) * groups_per_row,
                      biases + size_t(n0 + g + 8) * groups_per_row};
  // This lane's x rows (B columns): g, and g + 8 for the second tile.
  bool has_row[TT];
  const T* xrow[TT];
#pragma unroll
  for (int tt = 0; tt < TT; ++tt) {
    has_row[tt] = g + 8 * tt < M;
    xrow[tt] = x + size_t(has_row[tt] ? g + 8 * tt : 0) * K;
  }

  float acc[TT][4];
#pragma unroll
  for (int tt = 0; tt < TT; ++tt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[tt][i] = 0.0f;

  // A batch of kU slices (s0, s0 + nw, ...) of both feature rows: weights, scales and biases.
  // 8-bit weights take twice the registers per slice, so their batches hold half the slices.
  constexpr int kU = BITS == 8 && kPipe ? (kUnroll + 1) / 2 : kUnroll;
  struct Batch {
    uint4 wv[kU][2][kLoads];
    T sv[kU][2], bv[kU][2];
  };
  auto load = [&](Batch& buf, int s0) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int s = s0 + u * nw;
      if (s < slices) {
        const int k = s * kSlice + 32 * t;  // this lane's first input
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint4* p = reinterpret_cast<const uint4*>(wrow[r] + k * BITS / 32);
#pragma unroll
          for (int l = 0; l < kLoads; ++l) buf.wv[u][r][l] = __ldcs(p + l);
          buf.sv[u][r] = srow[r][k / GS];
          buf.bv[u][r] = brow[r][k / GS];
        }
      }
    }
  };
  // The batch's products, in slice order (the same sums whichever way the loads were batched).
  auto compute = [&](const Batch& buf, int s0) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int s = s0 + u * nw;
      if (s >= slices) break;
      const int k = s * kSlice + 32 * t;
      // x: 32 inputs per row, as 4 x 8 values.
      uint4 xv[TT][4];
#pragma unroll
      for (int tt = 0; tt < TT; ++tt) {
        const uint4* p = reinterpret_cast<const uint4*>(xrow[tt] + k);
#pragma unroll
        for (int l = 0; l < 4; ++l) xv[tt][l] = has_row[tt] ? p[l] : make_uint4(0u, 0u, 0u, 0u);
      }
      if (norm) {
        const uint4* np = reinterpret_cast<const uint4*>(norm + k);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
          const uint4 nv = np[l];
#pragma unroll
          for (int tt = 0; tt < TT; ++tt) {
            uint4& v = xv[tt][l];
            v.x = as_u32<T>(__hmul2(as_t2<T>(v.x), as_t2<T>(nv.x)));
            v.y = as_u32<T>(__hmul2(as_t2<T>(v.y), as_t2<T>(nv.y)));
            v.z = as_u32<T>(__hmul2(as_t2<T>(v.z), as_t2<T>(nv.z)));
            v.w = as_u32<T>(__hmul2(as_t2<T>(v.w), as_t2<T>(nv.w)));
          }
        }
      }
      if constexpr (BITS == 4) {
        T2 s2[2], b2[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          s2[r] = T2(buf.sv[u][r], buf.sv[u][r]);
          b2[r] = T2(buf.bv[u][r], buf.bv[u][r]);
        }
        // Word j (of 4) covers inputs 8j .. 8j + 7: mma steps 2j, 2j + 1.
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          u32 lo[2][2], hi[2][2];  // [feature row][step h]
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint4& q = buf.wv[u][r][0];
            const u32 word = j == 0 ? q.x : j == 1 ? q.y : j == 2 ? q.z : q.w;
            dequant4<T>(word, s2[r], b2[r], lo[r], hi[r]);
          }
#pragma unroll
          for (int tt = 0; tt < TT; ++tt) {
            // The 8 x values of word j: X0 = (x0, x1) ... X3 = (x6, x7).
            const uint4& xq = xv[tt][j];
            const u32 x04 = __byte_perm(xq.x, xq.z, 0x5410);
            const u32 x15 = __byte_perm(xq.x, xq.z, 0x7632);
            const u32 x26 = __byte_perm(xq.y, xq.w, 0x5410);
            const u32 x37 = __byte_perm(xq.y, xq.w, 0x7632);
            const u32 a0[4] = {lo[0][0], lo[1][0], hi[0][0], hi[1][0]};
            O::mma(acc[tt], a0, x04, x15);
            const u32 a1[4] = {lo[0][1], lo[1][1], hi[0][1], hi[1][1]};
            O::mma(acc[tt], a1, x26, x37);
          }
        }
      } else {
        float sf[2], bf[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          sf[r] = O::to_float(buf.sv[u][r]);
          bf[r] = O::to_float(buf.bv[u][r]);
        }
        // Word j (of 8) covers inputs 4j .. 4j + 3: mma step j.
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          u32 lo[2], hi[2];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint4& q = buf.wv[u][r][j / 4];
            const u32 word = j % 4 == 0 ? q.x : j % 4 == 1 ? q.y : j % 4 == 2 ? q.z : q.w;
            dequant8<T>(word, sf[r], bf[r], lo[r], hi[r]);
          }
#pragma unroll
          for (int tt = 0; tt < TT; ++tt) {
            const uint4& xq = xv[tt][j / 2];
            const u32 x01 = j % 2 == 0 ? xq.x : xq.z;
            const u32 x23 = j % 2 == 0 ? xq.y : xq.w;
            const u32 a[4] = {lo[0], lo[1], hi[0], hi[1]};
            O::mma(acc[tt], a, x01, x23);
          }
        }
      }
    }
  };
  if constexpr (kPipe) {
    // Software pipeline: the next batch's loads are in flight while this batch is computed, and
    // the next batch's x rows are prefetched into L1 (the weights stream from HBM once; x is
    // read by every block and otherwise arrives from L2 at each slice).
    Batch cur, nxt;
    load(cur, wi);
    pro();
    for (int s0 = wi; s0 < slices; s0 += nw * kU) {
      const int s1 = s0 + nw * kU;
      if (s1 < slices) {
        load(nxt, s1);
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int s = s1 + u * nw;
#pragma unroll
          for (int tt = 0; tt < TT; ++tt)
            if (s < slices && has_row[tt])
              asm volatile("prefetch.global.L1 [%0];" ::"l"(xrow[tt] + s * kSlice + 32 * t));
        }
      }
      compute(cur, s0);
      cur = nxt;
    }
  } else {
    bool first = true;
    for (int s0 = wi; s0 < slices; s0 += nw * kU) {
      Batch buf;
      load(buf, s0);
      if (first) pro();
      first = false;
      compute(buf, s0);
    }
    if (first) pro();
  }

  // C fragment: c[i] is feature g + 8 * (i / 2), row 2t + (i % 2) of the tile.
#pragma unroll
  for (int tt = 0; tt < TT; ++tt)
#pragma unroll
    for (int i = 0; i < 4; ++i) part[g + 8 * (i / 2)][8 * tt + 2 * t + (i % 2)] = acc[tt][i];
}

}  // namespace lmx_qmv_detail

namespace lmx_qmv_detail {

// 1 / rms of x's rows for a fused RMSNorm: warp wi of nw takes rows wi, wi + nw, ... and leaves
// rsqrt(mean(x^2) + eps) in inv[row] (the caller syncs before reading it).
template <typename T>
struct RowInvRms {
  const T* x;
  float* inv;
  int M, K, wi, nw;
  float eps;
  __device__ void operator()() const {
    const int lane = threadIdx.x % 32;
    for (int r = wi; r < M; r += nw) {
      const uint4* p = reinterpret_cast<const uint4*>(x + size_t(r) * K);
      float ss = 0.0f;
      for (int i = lane; i < K / 8; i += 32) {
        const uint4 v = p[i];
        const u32 words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float a = Ops<T>::lo(words[j]), b = Ops<T>::hi(words[j]);
          ss += a * a + b * b;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) inv[r] = rsqrtf(ss / K + eps);
    }
  }
};

}  // namespace lmx_qmv_detail

template <typename T, int BITS, int GS, int TT>
__device__ void lmx_qmv(const T* __restrict__ x, const unsigned int* __restrict__ w,
                        const T* __restrict__ scales, const T* __restrict__ biases,
                        T* __restrict__ out, int M, int N, int K) {
  using namespace lmx_qmv_detail;
  __shared__ float partial[kWarps][16][8 * TT];
  const int warp = threadIdx.x / 32;
  const int n0 = blockIdx.x * 16;
  partial_tile<T, BITS, GS, TT>(x, w, scales, biases, M, K, n0, warp, kWarps, partial[warp]);
  __syncthreads();
  // One thread per output element of the block: 16 features x M rows (M <= 8 * TT <= 16).
  for (int idx = threadIdx.x; idx < 16 * M; idx += 32 * kWarps) {
    const int f = idx % 16, row = idx / 16;
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum += partial[v][f][row];
    out[size_t(row) * N + n0 + f] = Ops<T>::from_float(sum);
  }
}

// Up to three matmuls of one x in one launch (a layer's q, k and v projections), or one whose
// result is added to a residual (the o and down projections): blocks first[i] .. first[i + 1] - 1
// compute out[i] (M, n[i]) = x (M, K) @ dequantize(w[i]).T with lmx_qmv's arithmetic, so each
// output is bit for bit that of its own lmx_qmv call. With `residual` (M, n[0]), count is 1 and
// out[0] = residual + round(x @ w[0].T), rounded again: the two ops of the unfused layer.
struct LmxQmvMulti {
  const void* x;
  const void* w[3];
  const void* scales[3];
  const void* biases[3];
  void* out[3];
  const void* residual;
  int n[3];
  int first[4];
  int count, M, K;
  // A fused RMSNorm of x (weight (K) or null, and its eps): each output is
  // round(rsqrt(mean(x^2) + eps) * sum(w * round(x * norm))), the unfused norm's roundings moved.
  const void* norm;
  float eps;
};

template <typename T, int BITS, int GS, int TT>
__device__ void lmx_qmv_multi(const LmxQmvMulti& a) {
  using namespace lmx_qmv_detail;
  using O = Ops<T>;
  __shared__ float partial[kWarps][16][8 * TT];
  __shared__ float inv_rms[8 * TT];
  int i = 0;
  while (i + 1 < a.count && int(blockIdx.x) >= a.first[i + 1]) ++i;
  const int warp = threadIdx.x / 32;
  const int n0 = (int(blockIdx.x) - a.first[i]) * 16, N = a.n[i], M = a.M;
  const T* x = static_cast<const T*>(a.x);
  const T* norm = static_cast<const T*>(a.norm);
  const RowInvRms<T> rms{x, inv_rms, norm ? M : 0, a.K, warp, kWarps, a.eps};
  partial_tile<T, BITS, GS, TT>(
      x, static_cast<const u32*>(a.w[i]), static_cast<const T*>(a.scales[i]),
      static_cast<const T*>(a.biases[i]), M, a.K, n0, warp, kWarps, partial[warp], norm, rms);
  __syncthreads();
  T* out = static_cast<T*>(a.out[i]);
  const T* res = static_cast<const T*>(a.residual);
  for (int idx = threadIdx.x; idx < 16 * M; idx += 32 * kWarps) {
    const int f = idx % 16, row = idx / 16;
    float sum = 0.0f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum += partial[v][f][row];
    if (norm) sum *= inv_rms[row];
    const size_t o = size_t(row) * N + n0 + f;
    out[o] = res ? O::from_float(O::to_float(O::from_float(sum)) + O::to_float(res[o]))
                 : O::from_float(sum);
  }
}

// A gated MLP's first half in one launch: out (M, N) = silu(x @ gate.T) * (x @ up.T), w[0] the
// gate and w[1] the up projection. Half of the block's warps take the gate's 16 features, half
// the up's (each half splitting K). Each projection is rounded to T, then silu(g) * u as the
// unfused layer's ops round (sigmoid, g * sigmoid, times u, each rounded to T).
struct LmxQmvSwiglu {
  const void* x;
  const void* w[2];
  const void* scales[2];
  const void* biases[2];
  void* out;
  int M, N, K;
  const void* norm;  // a fused RMSNorm of x, as LmxQmvMulti's
  float eps;
};

template <typename T, int BITS, int GS, int TT>
__device__ void lmx_qmv_swiglu(const LmxQmvSwiglu& a) {
  using namespace lmx_qmv_detail;
  using O = Ops<T>;
  static_assert(kWarps % 2 == 0, "an even number of warps");
  constexpr int kHalf = kWarps / 2;
  __shared__ float partial[kWarps][16][8 * TT];
  __shared__ float inv_rms[8 * TT];
  const int warp = threadIdx.x / 32, m = warp / kHalf;
  const int n0 = blockIdx.x * 16, M = a.M;
  // Selected, not indexed by m: an index into the parameters puts them on the stack.
  const void* w = m ? a.w[1] : a.w[0];
  const void* s = m ? a.scales[1] : a.scales[0];
  const void* b = m ? a.biases[1] : a.biases[0];
  const T* x = static_cast<const T*>(a.x);
  const T* norm = static_cast<const T*>(a.norm);
  const RowInvRms<T> rms{x, inv_rms, norm ? M : 0, a.K, warp, kWarps, a.eps};
  partial_tile<T, BITS, GS, TT>(x, static_cast<const u32*>(w), static_cast<const T*>(s),
                                static_cast<const T*>(b), M, a.K, n0, warp % kHalf, kHalf,
                                partial[warp], norm, rms);
  __syncthreads();
  T* out = static_cast<T*>(a.out);
  for (int idx = threadIdx.x; idx < 16 * M; idx += 32 * kWarps) {
    const int f = idx % 16, row = idx / 16;
    float g = 0.0f, u = 0.0f;
#pragma unroll
    for (int v = 0; v < kHalf; ++v) {
      g += partial[v][f][row];
      u += partial[kHalf + v][f][row];
    }
    if (norm) {
      g *= inv_rms[row];
      u *= inv_rms[row];
    }
    const float gr = O::to_float(O::from_float(g)), ur = O::to_float(O::from_float(u));
    const float sig = O::to_float(O::from_float(1.0f / (1.0f + expf(-gr))));
    const float gs = O::to_float(O::from_float(gr * sig));
    out[size_t(row) * a.N + n0 + f] = O::from_float(gs * ur);
  }
}
