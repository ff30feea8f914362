// The quantized-matmul inner kernel, written once with GCC vector extensions and compiled once
// per ISA (qmm_generic.cpp, qmm_avx2.cpp, qmm_avx512.cpp) under that ISA's flags, with the ISA's
// native vector (xmm, ymm, zmm). Everything here lives in the including file's namespace
// LMX_QMM_NS and includes no library headers (immintrin.h's functions are static), so no inline
// function compiled for a wider ISA can be picked by the linker for code on a narrower CPU.
//
// Per output row n (a weight row) and group g: w = scale[n, g] * q + bias[n, g] (MLX's affine
// dequantization), out[m, n] = sum_k w[k] * x[m, k], accumulated in float32.
#pragma once

// The vector helpers are internal to one file; their ABI does not matter.
#pragma GCC diagnostic ignored "-Wpsabi"
// GCC 12 reports its own _mm512_undefined_* placeholders in avx512fintrin.h as uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/cpu/qmm_args.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#ifndef LMX_QMM_NS
#error "define LMX_QMM_NS before including qmm_kernel.h"
#endif

namespace lmx::kernels::cpu::LMX_QMM_NS {

// One native vector per ISA: GCC lowers wider vector types through the stack.
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX2__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
typedef float vf __attribute__((vector_size(kLanes * 4)));
typedef unsigned char vu8x16 __attribute__((vector_size(16)));

constexpr int kRowBlock = 4;  // weight rows dequantized together, each reused across x rows

inline float half_to_float(unsigned short h) {
  const unsigned sign = (h & 0x8000u) << 16;
  unsigned exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

inline float scale_at(const void* p, ScaleType t, long i) {
  switch (t) {
    case ScaleType::f32:
      return static_cast<const float*>(p)[i];
    case ScaleType::bf16: {
      const unsigned bits = static_cast<unsigned>(static_cast<const unsigned short*>(p)[i]) << 16;
      float f;
      __builtin_memcpy(&f, &bits, 4);
      return f;
    }
    case ScaleType::f16:
      return half_to_float(static_cast<const unsigned short*>(p)[i]);
  }
  return 0;
}

inline vf load(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof(vf));
  return v;
}

inline vu8x16 load_u8x16(const unsigned char* p) {
  vu8x16 v;
  __builtin_memcpy(&v, p, 16);
  return v;
}

// 16 bytes q to 16 floats s * q + b at out. GCC scalarizes __builtin_convertvector(u8 -> float),
// so the widening is spelled out per ISA.
inline void dequant16(vu8x16 b, vf s, vf bias, float* out) {
  vf f[16 / kLanes];
#if defined(__AVX512F__)
  f[0] =
      reinterpret_cast<vf>(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(reinterpret_cast<__m128i>(b))));
#elif defined(__AVX2__)
  const __m128i v = reinterpret_cast<__m128i>(b);
  f[0] = reinterpret_cast<vf>(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)));
  f[1] = reinterpret_cast<vf>(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))));
#elif defined(__SSE2__)
  const __m128i v = reinterpret_cast<__m128i>(b), z = _mm_setzero_si128();
  const __m128i w0 = _mm_unpacklo_epi8(v, z), w1 = _mm_unpackhi_epi8(v, z);
  f[0] = reinterpret_cast<vf>(_mm_cvtepi32_ps(_mm_unpacklo_epi16(w0, z)));
  f[1] = reinterpret_cast<vf>(_mm_cvtepi32_ps(_mm_unpackhi_epi16(w0, z)));
  f[2] = reinterpret_cast<vf>(_mm_cvtepi32_ps(_mm_unpacklo_epi16(w1, z)));
  f[3] = reinterpret_cast<vf>(_mm_cvtepi32_ps(_mm_unpackhi_epi16(w1, z)));
#else
  for (int i = 0; i < 16; ++i) f[i / kLanes][i % kLanes] = static_cast<float>(b[i]);
#endif
  for (int i = 0; i < 16 / kLanes; ++i) {
    const vf r = f[i] * s + bias;
    __builtin_memcpy(out + static_cast<long>(i) * kLanes, &r, sizeof(vf));
  }
}

// One weight row, dequantized to float32 in the kernel's element order (see QmmArgs::x): 4-bit
// blocks of 32 come out as the 16 low nibbles then the 16 high nibbles; other widths in order.
inline void dequant_row(const QmmArgs& a, int n, float* out) {
  const long row_bytes = static_cast<long>(a.K) * a.bits / 8;
  const unsigned char* p = a.w + n * row_bytes;
  const int groups = a.K / a.group_size;
  for (int g = 0; g < groups; ++g) {
    const float s = scale_at(a.scales, a.scale_type, static_cast<long>(n) * groups + g);
    const float b = scale_at(a.biases, a.scale_type, static_cast<long>(n) * groups + g);
    const vf vs = vf{} + s, vb = vf{} + b;
    const int k0 = g * a.group_size;
    float* o = out + k0;
    if (a.bits == 4) {
      const unsigned char* q = p + k0 / 2;
      for (int j = 0; j < a.group_size; j += 32, q += 16, o += 32) {
        const vu8x16 v = load_u8x16(q);
        dequant16(v & 15, vs, vb, o);
        dequant16(v >> 4, vs, vb, o + 16);
      }
    } else if (a.bits == 8) {
      const unsigned char* q = p + k0;
      for (int j = 0; j < a.group_size; j += 16) dequant16(load_u8x16(q + j), vs, vb, o + j);
    } else {
      // Any width: element k occupies bits [k * bits, (k + 1) * bits) of the row, LSB first.
      const unsigned mask = (1u << a.bits) - 1;
      for (int j = 0; j < a.group_size; ++j) {
        const long bit = static_cast<long>(k0 + j) * a.bits;
        const long byte = bit >> 3;
        unsigned v = p[byte];
        if (byte + 1 < row_bytes) v |= static_cast<unsigned>(p[byte + 1]) << 8;
        o[j] = static_cast<float>((v >> (bit & 7)) & mask) * s + b;
      }
    }
  }
}

inline float hsum(vf v) {
  float s = 0;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

// x rows processed together: kRowBlock * kXBlock independent accumulators hide the FMA latency
// (AVX2 has 16 vector registers, AVX-512 32).
constexpr int kXBlock = kLanes == 16 ? 4 : 2;

// out[m .. m + MB, nb .. nb + rows) from kRowBlock dequantized weight rows w.
template <int MB>
inline void dot_block(const QmmArgs& a, const float* const* w, int m, int nb, int rows) {
  vf c[MB][kRowBlock] = {};
  const float* x[MB];
  for (int i = 0; i < MB; ++i) x[i] = a.x + static_cast<long>(m + i) * a.K;
  for (int k = 0; k < a.K; k += kLanes) {
    vf wv[kRowBlock];
    for (int r = 0; r < kRowBlock; ++r) wv[r] = load(w[r] + k);
    for (int i = 0; i < MB; ++i) {
      const vf xv = load(x[i] + k);
      for (int r = 0; r < kRowBlock; ++r) c[i][r] += wv[r] * xv;
    }
  }
  for (int i = 0; i < MB; ++i) {
    float* o = a.out + static_cast<long>(m + i) * a.N + nb;
    for (int r = 0; r < rows; ++r) o[r] = hsum(c[i][r]);
  }
}

// out[m, n] for rows n in [n0, n1) and every m; x is (M, K) float32 in the kernel's order, out
// (M, N) float32. wbuf holds kRowBlock * K floats.
inline void qmm_rows(const QmmArgs& a, int n0, int n1, float* wbuf) {
  for (int nb = n0; nb < n1; nb += kRowBlock) {
    const int rows = n1 - nb < kRowBlock ? n1 - nb : kRowBlock;
    // Decode streams each weight byte once: ask for the next block while this one computes (a
    // task's rows span few 4 KiB pages, where the hardware prefetcher stops).
    if (nb + kRowBlock < a.N) {
      const long row_bytes = static_cast<long>(a.K) * a.bits / 8;
      const unsigned char* next = a.w + (nb + kRowBlock) * row_bytes;
      for (long off = 0; off < kRowBlock * row_bytes; off += 64) __builtin_prefetch(next + off);
    }
    for (int r = 0; r < rows; ++r) dequant_row(a, nb + r, wbuf + static_cast<long>(r) * a.K);
    for (int r = rows; r < kRowBlock; ++r) {
      // A short block computes on copies of its first row; the results are not stored.
      for (int k = 0; k < a.K; ++k) wbuf[static_cast<long>(r) * a.K + k] = wbuf[k];
    }
    const float* w[kRowBlock] = {wbuf, wbuf + a.K, wbuf + 2L * a.K, wbuf + 3L * a.K};
    int m = 0;
    for (; m + kXBlock <= a.M; m += kXBlock) dot_block<kXBlock>(a, w, m, nb, rows);
    for (; m < a.M; ++m) dot_block<1>(a, w, m, nb, rows);
  }
}

// kLanes keys or values from element i of a cache row stored as T, as float32.
template <ScaleType T>
inline vf load_kv(const void* row, long i) {
  if constexpr (T == ScaleType::f32) {
    return load(static_cast<const float*>(row) + i);
  } else {
    typedef unsigned short vh __attribute__((vector_size(kLanes * 2)));
    typedef unsigned int vw __attribute__((vector_size(kLanes * 4)));
    vh h;
    __builtin_memcpy(&h, static_cast<const unsigned short*>(row) + i, sizeof(vh));
    vf r;
    if constexpr (T == ScaleType::bf16) {  // the high half of a float32
      const vw w = __builtin_convertvector(h, vw) << 16;
      __builtin_memcpy(&r, &w, sizeof(vf));
    } else {
#if defined(__AVX512F__)
      __m256i x;
      __builtin_memcpy(&x, &h, sizeof(x));
      const __m512 f = _mm512_cvtph_ps(x);
      __builtin_memcpy(&r, &f, sizeof(vf));
#elif defined(__F16C__)
      __m128i x;
      __builtin_memcpy(&x, &h, sizeof(x));
      const __m256 f = _mm256_cvtph_ps(x);
      __builtin_memcpy(&r, &f, sizeof(vf));
#else
      for (int j = 0; j < kLanes; ++j) r[j] = half_to_float(h[j]);
#endif
    }
    return r;
  }
}

constexpr int kAttnRows = 8;  // query rows per pass: their accumulators stay in registers

typedef int vi __attribute__((vector_size(kLanes * 4)));

// Shuffle masks of fold<H>: lane i of block b (2H lanes) takes lane b + i of a (i < H) or lane
// b + i - H of b (i >= H), and its partner H lanes further.
constexpr int fold_lo(int H, int i) { return i % (2 * H) < H ? i : kLanes + i - H; }
constexpr int fold_hi(int H, int i) { return fold_lo(H, i) + H; }
template <int H, int... I>
inline vf fold_impl(vf a, vf b) {
  constexpr vi lo = {fold_lo(H, I)...}, hi = {fold_hi(H, I)...};
  return __builtin_shuffle(a, b, lo) + __builtin_shuffle(a, b, hi);
}
// Within each block of 2H lanes: the first H hold a's lanes summed in pairs H apart, the last H
// b's.
template <int H>
inline vf fold(vf a, vf b) {
  return fold_impl<H, __integer_pack(kLanes)...>(a, b);
}

constexpr int bitrev(int i) {
  int r = 0;
  for (int b = 1; b < kLanes; b <<= 1, i >>= 1) r = (r << 1) | (i & 1);
  return r;
}

// One level of reduce_lanes: 2H vectors into H.
template <int H>
inline vf reduce_level(vf* v) {
  for (int i = 0; i < H; ++i) v[i] = fold<H>(v[2L * i], v[2L * i + 1]);
  if constexpr (H == 1) {
    return v[0];
  } else {
    return reduce_level<H / 2>(v);
  }
}

// r[j] = the sum of the lanes of v[bitrev(j)], in kLanes - 1 vector adds; v is overwritten.
inline vf reduce_lanes(vf* v) { return reduce_level<kLanes / 2>(v); }

// exp(x) per lane, within a few ulp: 2^n e^r with |r| <= ln(2) / 2, e^r a degree-6 Taylor
// polynomial (its remainder below 2e-7 relative); lanes below -87.3 (e^x under FLT_MIN, -inf
// among them) are 0.
inline vf vexp(vf x) {
  const vf lo = vf{} - 87.3f, hi = vf{} + 88.7f;
  const vf xc = x < lo ? lo : (x > hi ? hi : x);
  const vf n = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest
  const vf r = (xc - n * 0.693145752f) - n * 1.42860677e-6f;    // ln 2 in two parts
  vf p = vf{} + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  vf s;
  __builtin_memcpy(&s, &e, sizeof(vf));
  const vf y = p * s;
  return x < lo ? vf{} : y;
}

// GateActFn: whole vectors, then the tail through the same lane arithmetic.
inline vf gate_act_lanes(vf x, vf u, bool gelu) {
  const vf z = gelu ? (x + x * x * x * 0.044715f) * -1.5957691216057308f : -x;
  return x / (vexp(z) + 1.0f) * u;
}

inline void gate_act(float* g, const float* u, long n, bool gelu) {
  long i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const vf y = gate_act_lanes(load(g + i), load(u + i), gelu);
    __builtin_memcpy(g + i, &y, sizeof(vf));
  }
  if (i < n) {
    vf x{}, v{};
    __builtin_memcpy(&x, g + i, (n - i) * sizeof(float));
    __builtin_memcpy(&v, u + i, (n - i) * sizeof(float));
    const vf y = gate_act_lanes(x, v, gelu);
    __builtin_memcpy(g + i, &y, (n - i) * sizeof(float));
  }
}

inline float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// MaxExpSumFn: four vectors a step, each with its own accumulators, then single vectors, then
// the tail in one vector.
inline void max_exp_sum(const float* x, int n, float* max_out, float* sum_out) {
  constexpr int kStep = 4 * kLanes;
  const float neg_inf = -__builtin_inff();
  vf vm[4] = {vf{} + neg_inf, vf{} + neg_inf, vf{} + neg_inf, vf{} + neg_inf};
  int i = 0;
  for (; i + kStep <= n; i += kStep)
    for (int j = 0; j < 4; ++j) {
      const vf v = load(x + i + static_cast<long>(j) * kLanes);
      vm[j] = v > vm[j] ? v : vm[j];
    }
  for (; i + kLanes <= n; i += kLanes) {
    const vf v = load(x + i);
    vm[0] = v > vm[0] ? v : vm[0];
  }
  float m = neg_inf;
  for (int j = 0; j < 4; ++j) {
    const float h = hmax(vm[j]);
    m = h > m ? h : m;
  }
  for (int t = i; t < n; ++t) m = x[t] > m ? x[t] : m;
  *max_out = m;
  if (m == neg_inf) {  // nothing, or only -inf: exp(x - m) is taken as 0
    *sum_out = 0.0f;
    return;
  }
  const vf mv = vf{} + m;
  vf acc[4] = {};
  for (i = 0; i + kStep <= n; i += kStep)
    for (int j = 0; j < 4; ++j) acc[j] += vexp(load(x + i + static_cast<long>(j) * kLanes) - mv);
  for (; i + kLanes <= n; i += kLanes) acc[0] += vexp(load(x + i) - mv);
  const vf all = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += all[l];
  if (i < n) {
    // The tail through the same vexp, its unused lanes at -inf (exp 0).
    vf tv;
    for (int l = 0; l < kLanes; ++l) tv[l] = l < n - i ? x[i + l] : neg_inf;
    const vf e = vexp(tv - mv);
    for (int l = 0; l < n - i; ++l) s += e[l];
  }
  *sum_out = s;
}

inline vf splat(float x) { return x - vf{}; }  // x - 0 is exact (x + 0 is not, for -0)

// Key rows [s0, s1) of AttnArgs rows [g0, g0 + G): per row its max score m, l = sum exp(score -
// m) and out = sum exp(score - m) V, unnormalized. G is a constant so that the per-row
// accumulators stay in registers.
template <ScaleType T, int G>
inline void attn_pass(const AttnArgs& a, int g0) {
  const int D = a.D, s0 = a.s0, n = a.s1 - a.s0, body = D - D % kLanes;
  const int chunks = (D + kLanes - 1) / kLanes;  // vectors per row, the last zero-padded
  const char* kb = static_cast<const char*>(a.K);
  const char* vb = static_cast<const char*>(a.V);
  const long esize = T == ScaleType::f32 ? 4 : 2;
  float* sc[G];
  for (int g = 0; g < G; ++g) sc[g] = a.scores + static_cast<long>(g) * n;
  constexpr int kMaxChunks = (kAttnMaxD + kLanes - 1) / kLanes;
  // The query rows, zero-padded; a block of kLanes key rows as float32, chunk-major (vector c
  // of key j at (c * kLanes + j) * kLanes), so that the score loop addresses it with constants.
  float qbuf[G * kMaxChunks * kLanes], kbuf[kMaxChunks * kLanes * kLanes];
  for (int g = 0; g < G; ++g) {
    const float* q = a.q + static_cast<long>(g0 + g) * a.qs;
    for (int d = 0; d < chunks * kLanes; ++d) qbuf[g * chunks * kLanes + d] = d < D ? q[d] : 0.0f;
  }
  for (int j0 = 0; j0 < n; j0 += kLanes) {
    const int nj = n - j0 < kLanes ? n - j0 : kLanes;
    for (int j = 0; j < kLanes; ++j) {
      if (j >= nj) {
        for (int c = 0; c < chunks; ++c)
          __builtin_memset(kbuf + (static_cast<long>(c) * kLanes + j) * kLanes, 0, sizeof(vf));
        continue;
      }
      const void* kr = kb + (s0 + j0 + j) * a.ks * esize;
      int c = 0;
      for (; c * kLanes < body; ++c) {
        const vf v = load_kv<T>(kr, c * kLanes);
        __builtin_memcpy(kbuf + (static_cast<long>(c) * kLanes + j) * kLanes, &v, sizeof(vf));
      }
      if (c < chunks) {
        vf v = {};
        for (int d = body; d < D; ++d) v[d - body] = scale_at(kr, T, d);
        __builtin_memcpy(kbuf + (static_cast<long>(c) * kLanes + j) * kLanes, &v, sizeof(vf));
      }
    }
    for (int g = 0; g < G; ++g) {
      // acc[bitrev(j)]: key j's products, summed across lanes by reduce_lanes.
      vf acc[kLanes] = {};
      const float* q = qbuf + g * chunks * kLanes;
      for (int c = 0; c < chunks; ++c) {
        const vf qv = load(q + static_cast<long>(c) * kLanes);
        const float* kc = kbuf + static_cast<long>(c) * kLanes * kLanes;
#pragma GCC unroll 16
        for (int j = 0; j < kLanes; ++j)
          acc[bitrev(j)] += qv * load(kc + static_cast<long>(j) * kLanes);
      }
      vf s = reduce_lanes(acc) * a.scale;
      __builtin_memcpy(sc[g] + j0, &s, static_cast<unsigned long>(nj) * 4);
    }
  }
  for (int g = 0; g < G; ++g) {
    vf mv = splat(-__builtin_inff());
    int j = 0;
    for (; j + kLanes <= n; j += kLanes) {
      const vf v = load(sc[g] + j);
      mv = v > mv ? v : mv;
    }
    float m = hmax(mv);
    for (; j < n; ++j) m = sc[g][j] > m ? sc[g][j] : m;
    vf sum = {};
    const vf vm = splat(m);
    for (j = 0; j + kLanes <= n; j += kLanes) {
      const vf p = vexp(load(sc[g] + j) - vm);
      __builtin_memcpy(sc[g] + j, &p, sizeof(vf));
      sum += p;
    }
    if (j < n) {
      vf t = splat(-__builtin_inff());
      __builtin_memcpy(&t, sc[g] + j, static_cast<unsigned long>(n - j) * 4);
      const vf p = vexp(t - vm);
      __builtin_memcpy(sc[g] + j, &p, static_cast<unsigned long>(n - j) * 4);
      sum += p;
    }
    a.m[g0 + g] = m;
    a.l[g0 + g] = hsum(sum);
  }
  // Per kLanes output features, the weighted sum over every value row in registers.
  for (int d = 0; d < body; d += kLanes) {
    vf acc[G] = {};
    const char* vr = vb + s0 * a.vs * esize;
    for (int j = 0; j < n; ++j, vr += a.vs * esize) {
      const vf vv = load_kv<T>(vr, d);
      for (int g = 0; g < G; ++g) acc[g] += splat(sc[g][j]) * vv;
    }
    for (int g = 0; g < G; ++g)
      __builtin_memcpy(a.out + static_cast<long>(g0 + g) * a.os + d, &acc[g], sizeof(vf));
  }
  for (int d = body; d < D; ++d)
    for (int g = 0; g < G; ++g) {
      float v = 0;
      for (int j = 0; j < n; ++j) v += sc[g][j] * scale_at(vb + (s0 + j) * a.vs * esize, T, d);
      a.out[static_cast<long>(g0 + g) * a.os + d] = v;
    }
}

template <ScaleType T>
inline void attn_all(const AttnArgs& a) {
  using Pass = void (*)(const AttnArgs&, int);
  static constexpr Pass kPasses[kAttnRows] = {attn_pass<T, 1>, attn_pass<T, 2>, attn_pass<T, 3>,
                                              attn_pass<T, 4>, attn_pass<T, 5>, attn_pass<T, 6>,
                                              attn_pass<T, 7>, attn_pass<T, 8>};
  for (int g0 = 0; g0 < a.G; g0 += kAttnRows)
    kPasses[(a.G - g0 < kAttnRows ? a.G - g0 : kAttnRows) - 1](a, g0);
}

inline void attn_group(const AttnArgs& a) {
  if (a.kv_type == ScaleType::f32)
    attn_all<ScaleType::f32>(a);
  else if (a.kv_type == ScaleType::bf16)
    attn_all<ScaleType::bf16>(a);
  else
    attn_all<ScaleType::f16>(a);
}

}  // namespace lmx::kernels::cpu::LMX_QMM_NS
