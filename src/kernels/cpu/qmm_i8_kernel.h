// The int8-activation quantized matmul (QmmI8Args), compiled once per flavour:
// qmm_i8_avx512vnni.cpp (512-bit vpdpbusd, 64 inputs per vector), qmm_i8_avxvnni.cpp (the
// VEX-encoded 256-bit vpdpbusd of AVX-VNNI, 32 inputs per vector) and qmm_i8_avx2.cpp (vpdpbusd
// as vpmaddubsw + vpmaddwd for one row of 4-bit weights, the int16 tiles below otherwise). Like
// qmm_kernel.h it lives in the including file's namespace LMX_QMM_NS and includes no library
// headers.
//
// Per output row n, 32-input block j and weight group g(j): the u8 weights q (4-bit unpacked in
// registers, or 8-bit as stored) times the two int8 limbs of the activations, 128 * (q . q1) + q
// . q2 summed exactly in int32 by vpdpbusd, then scaled in float32 by s[n, g] * xd[m, j] and
// accumulated; the bias term is b[n, g] * xsum[m, g] once per group.
#pragma once

#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include "kernels/cpu/qmm_args.h"

#ifndef LMX_QMM_NS
#error "define LMX_QMM_NS before including qmm_i8_kernel.h"
#endif

namespace lmx::kernels::cpu::LMX_QMM_NS {

constexpr int kRows = 4;  // weight rows unpacked together, each reused across x rows

#if defined(__AVX512F__)
constexpr int kChunk = 64;
constexpr int kXRows = 2;  // x rows per pass: 4 x 2 accumulators fit the 32 zmm registers
#else
constexpr int kChunk = 32;
constexpr int kXRows = 1;  // 16 ymm registers
#endif

// n float scales or biases from p[0 .. n) into out, as float32.
inline void to_float(const void* p, ScaleType t, int n, float* out) {
  int i = 0;
  if (t == ScaleType::f32) {
    __builtin_memcpy(out, p, static_cast<unsigned long>(n) * 4);
    return;
  }
  const unsigned short* h = static_cast<const unsigned short*>(p);
  for (; i + 8 <= n; i += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
    __m256 f;
    if (t == ScaleType::f16) {
      f = _mm256_cvtph_ps(v);
    } else {  // bf16: the high half of a float32
      f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    }
    _mm256_storeu_ps(out + i, f);
  }
  for (; i < n; ++i) {
    if (t == ScaleType::f16) {
      out[i] = _cvtsh_ss(h[i]);
    } else {
      const unsigned bits = static_cast<unsigned>(h[i]) << 16;
      __builtin_memcpy(out + i, &bits, 4);
    }
  }
}

inline float dot_f32(const float* a, const float* b, int n) {
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  float s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
            ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// 32 weights of one row as u8: 4-bit as the 16 low nibbles then the 16 high ones (the order of
// QmmI8Args::xq), 8-bit as stored.
template <int BITS>
inline __m256i load_w32(const unsigned char* p) {
  if constexpr (BITS == 4) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256i y = _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    return _mm256_and_si256(y, _mm256_set1_epi8(15));
  } else {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
}

// 128 * (w . x1) + w . x2 per int32 lane (4 inputs each).
inline __m256i dp32(__m256i w, __m256i x1, __m256i x2) {
#if defined(LMX_I8_MADDUBS)
  // 4-bit w: |w0 x0 + w1 x1| <= 15 * 128 * 2, inside int16, so exactly vpdpbusd's sums.
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(w, x1), ones);
  const __m256i p2 = _mm256_madd_epi16(_mm256_maddubs_epi16(w, x2), ones);
  return _mm256_add_epi32(_mm256_slli_epi32(p1, 7), p2);
#elif defined(__AVX512F__)
  const __m256i p = _mm256_slli_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x1), 7);
  return _mm256_dpbusd_epi32(p, w, x2);
#else
  const __m256i p = _mm256_slli_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, x1), 7);
  return _mm256_dpbusd_avx_epi32(p, w, x2);
#endif
}

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

#if defined(__AVX512F__)
// 64 weights of one row: 4-bit as the 32 low nibbles (even inputs) then the 32 high ones (odd).
template <int BITS>
inline __m512i load_w64(const unsigned char* p) {
  if constexpr (BITS == 4) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
    return _mm512_and_si512(z, _mm512_set1_epi8(15));
  } else {
    return _mm512_loadu_si512(p);
  }
}
#endif

// out[m .. m + MB, nb .. nb + rows) from weight rows nb .. nb + kRows (short blocks repeat
// their last row; those results are not stored). sb: per row, its group scales then biases.
template <int BITS, int MB>
inline void block(const QmmI8Args& a, int nb, int rows, int m, const float* sb, bool fetch) {
  const int groups = a.K / a.group_size;
  const long row_bytes = static_cast<long>(a.K) * BITS / 8;
  const unsigned char* wr[kRows];
  const float* s[kRows];
  for (int r = 0; r < kRows; ++r) {
    const int rr = r < rows ? r : rows - 1;
    wr[r] = a.w + (nb + rr) * row_bytes;
    s[r] = sb + 2L * rr * groups;
  }
  const signed char* xq[MB];
  const float* xd[MB];
  for (int i = 0; i < MB; ++i) {
    xq[i] = a.xq + static_cast<long>(m + i) * 2 * a.K;  // q1; q2 follows at + K
    xd[i] = a.xd + static_cast<long>(m + i) * (a.K / 32);
  }
  const int gshift = a.group_size == 32 ? 5 : a.group_size == 64 ? 6 : 7;
  float tail[MB][kRows] = {};
  int k = 0;
#if defined(__AVX512F__)
  // int32 lane l of a 64-input vector sums 4 inputs: of block 2c for lanes 0-3 and 8-11 and of
  // block 2c + 1 for 4-7 and 12-15 (4-bit: even inputs then odd ones); lanes 0-7 and 8-15
  // (8-bit).
  const __mmask16 second = BITS == 4 ? 0xF0F0 : 0xFF00;
  __m512 acc[MB][kRows];
  for (int i = 0; i < MB; ++i)
    for (int r = 0; r < kRows; ++r) acc[i][r] = _mm512_setzero_ps();
  for (; k + 64 <= a.K; k += 64) {
    const int j = k >> 5;
    __m512i wv[kRows];
    __m512 sv[kRows];
    if (fetch)  // the next block's rows, as fast as this block's are consumed
      for (int r = 0; r < kRows; ++r) __builtin_prefetch(wr[r] + k * BITS / 8 + kRows * row_bytes);
    for (int r = 0; r < kRows; ++r) {
      wv[r] = load_w64<BITS>(wr[r] + k * BITS / 8);
      const int g0 = k >> gshift, g1 = (k + 32) >> gshift;
      sv[r] = _mm512_mask_blend_ps(second, _mm512_set1_ps(s[r][g0]), _mm512_set1_ps(s[r][g1]));
    }
    for (int i = 0; i < MB; ++i) {
      const __m512i x1 = _mm512_loadu_si512(xq[i] + k), x2 = _mm512_loadu_si512(xq[i] + a.K + k);
      const __m512 dv =
          _mm512_mask_blend_ps(second, _mm512_set1_ps(xd[i][j]), _mm512_set1_ps(xd[i][j + 1]));
      for (int r = 0; r < kRows; ++r) {
        __m512i p = _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[r], x1), 7);
        p = _mm512_dpbusd_epi32(p, wv[r], x2);
        acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sv[r], dv), acc[i][r]);
      }
    }
  }
#else
  __m256 acc[MB][kRows];
  for (int i = 0; i < MB; ++i)
    for (int r = 0; r < kRows; ++r) acc[i][r] = _mm256_setzero_ps();
  for (; k + 32 <= a.K; k += 32) {
    const int j = k >> 5, g = k >> gshift;
    __m256i wv[kRows];
    if (fetch)
      for (int r = 0; r < kRows; ++r) __builtin_prefetch(wr[r] + k * BITS / 8 + kRows * row_bytes);
    for (int r = 0; r < kRows; ++r) wv[r] = load_w32<BITS>(wr[r] + k * BITS / 8);
    for (int i = 0; i < MB; ++i) {
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i] + k));
      const __m256i x2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i] + a.K + k));
      const float d = xd[i][j];
      for (int r = 0; r < kRows; ++r) {
        const __m256i p = dp32(wv[r], x1, x2);
        acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s[r][g] * d), acc[i][r]);
      }
    }
  }
#endif
  if (k < a.K) {  // a last block of 32 (K is a multiple of 32)
    const int j = k >> 5, g = k >> gshift;
    for (int r = 0; r < kRows; ++r) {
      const __m256i wv = load_w32<BITS>(wr[r] + k * BITS / 8);
      for (int i = 0; i < MB; ++i) {
        const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i] + k));
        const __m256i x2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i] + a.K + k));
        tail[i][r] = hsum(_mm256_cvtepi32_ps(dp32(wv, x1, x2))) * (s[r][g] * xd[i][j]);
      }
    }
  }
  for (int i = 0; i < MB; ++i) {
    float* o = a.out + static_cast<long>(m + i) * a.N + nb;
    const float* xs = a.xsum + static_cast<long>(m + i) * groups;
    for (int r = 0; r < rows; ++r) {
#if defined(__AVX512F__)
      const float v = _mm512_reduce_add_ps(acc[i][r]);
#else
      const float v = hsum(acc[i][r]);
#endif
      o[r] = v + tail[i][r] + dot_f32(s[r] + groups, xs, groups);
    }
  }
}

template <int BITS>
inline void rows_impl(const QmmI8Args& a, int n0, int n1, float* sb) {
  const int groups = a.K / a.group_size;
  for (int nb = n0; nb < n1; nb += kRows) {
    const int rows = n1 - nb < kRows ? n1 - nb : kRows;
    // Each weight byte is read once per call: block() asks for the next block's bytes while it
    // computes (a task's rows span few 4 KiB pages, where the hardware prefetcher stops).
    const bool fetch = nb + 2 * kRows <= a.N;
    for (int r = 0; r < rows; ++r) {
      const long at = static_cast<long>(nb + r) * groups;
      to_float(static_cast<const char*>(a.scales) + at * (a.scale_type == ScaleType::f32 ? 4 : 2),
               a.scale_type, groups, sb + 2L * r * groups);
      to_float(static_cast<const char*>(a.biases) + at * (a.scale_type == ScaleType::f32 ? 4 : 2),
               a.scale_type, groups, sb + 2L * r * groups + groups);
    }
    int m = 0;
    for (; m + kXRows <= a.M; m += kXRows) block<BITS, kXRows>(a, nb, rows, m, sb, fetch && m == 0);
    for (; m < a.M; ++m) block<BITS, 1>(a, nb, rows, m, sb, fetch && m == 0);
  }
}

// 32 int32 values (4 vectors, in order) -> 32 int8 in order.
inline __m256i pack_i8(const __m256i v[4]) {
  const __m256i p =
      _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  // packs works within 128-bit lanes: 4-byte groups come out as 0, 2, 4, 6, 1, 3, 5, 7.
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// 32 int8 in order -> their 16 even elements then their 16 odd ones.
inline __m256i even_odd(__m256i v) {
  const __m256i sh = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4,
                                      6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, sh), 0xD8);  // qwords 0, 2, 1, 3
}

// x (M, K) float32 -> QmmI8Args' xq (M, 2, K), xd (M, K / 32) and xsum (M, K / group_size);
// bsum: K / 32 floats of scratch. Per block of 32: id = 127 / amax, d = amax / 127, q1 = round(x
// * id), q2 = round((x - q1 * d) * (id * 128)), each operation rounded once (this file is built
// without FMA contraction), round half to even.
inline void quantize_x(const float* x, int M, int K, int group_size, int bits, signed char* xq,
                       float* xd, float* xsum, float* bsum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (long m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    signed char* q1r = xq + 2 * m * K;
    signed char* q2r = q1r + K;
    __m256i prev[2] = {};  // 4-bit, 64-input chunks: the even/odd halves of the chunk's first block
    for (int j = 0; j < K / 32; ++j) {
      __m256 v[4], amax = _mm256_setzero_ps();
      for (int t = 0; t < 4; ++t) {
        v[t] = _mm256_loadu_ps(xr + 32L * j + 8L * t);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[t]));
      }
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      const float am = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
      const float id = am > 0 ? 127.0f / am : 0.0f, d = am / 127.0f;
      const __m256 vid = _mm256_set1_ps(id), vd = _mm256_set1_ps(d),
                   vid2 = _mm256_set1_ps(id * 128.0f);
      __m256i i1[4], i2[4];
      __m256 tot = _mm256_setzero_ps();
      for (int t = 0; t < 4; ++t) {
        const __m256 q1 = _mm256_round_ps(_mm256_mul_ps(v[t], vid), kRound);
        const __m256 r = _mm256_sub_ps(v[t], _mm256_mul_ps(q1, vd));
        const __m256 q2 = _mm256_round_ps(_mm256_mul_ps(r, vid2), kRound);
        i1[t] = _mm256_cvtps_epi32(q1);
        i2[t] = _mm256_cvtps_epi32(q2);
        tot = _mm256_add_ps(tot, _mm256_add_ps(_mm256_mul_ps(q1, _mm256_set1_ps(128.0f)), q2));
      }
      xd[m * (K / 32) + j] = d / 128.0f;
      bsum[j] = (d / 128.0f) * hsum(tot);  // integers below 2^24: hsum is exact
      __m256i b1 = pack_i8(i1), b2 = pack_i8(i2);
      if (bits == 4) {
        b1 = even_odd(b1);
        b2 = even_odd(b2);
        if (kChunk == 64 && (j & 1) == 0 && 32 * j + 64 <= K) {
          prev[0] = b1;  // wait for the chunk's second block
          prev[1] = b2;
          continue;
        }
        if (kChunk == 64 && (j & 1) == 1) {
          // [even A | odd A], [even B | odd B] -> [even A | even B], [odd A | odd B]
          const int at = 32 * (j - 1);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(q1r + at),
                              _mm256_permute2x128_si256(prev[0], b1, 0x20));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(q1r + at + 32),
                              _mm256_permute2x128_si256(prev[0], b1, 0x31));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(q2r + at),
                              _mm256_permute2x128_si256(prev[1], b2, 0x20));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(q2r + at + 32),
                              _mm256_permute2x128_si256(prev[1], b2, 0x31));
          continue;
        }
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q1r + 32L * j), b1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q2r + 32L * j), b2);
    }
    for (int g = 0; g < K / group_size; ++g) {
      float sum = 0;
      for (int j = g * group_size / 32; j < (g + 1) * group_size / 32; ++j) sum += bsum[j];
      xsum[m * (K / group_size) + g] = sum;
    }
  }
}

#if defined(__AVX512F__)
// 16 scales or biases of the packed layout (QmmI8Args::w under packed_rows) as float32.
inline __m512 load16(const unsigned char* p, ScaleType t) {
  if (t == ScaleType::f32) return _mm512_loadu_ps(p);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if (t == ScaleType::f16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 4 int8 activations k .. k + 3 in every int32 lane.
inline __m512i bcast4(const signed char* p) {
  int v;
  __builtin_memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The 64-bit mask at p (byte-aligned).
inline __mmask64 mask64(const unsigned char* p) {
  unsigned long long m;
  __builtin_memcpy(&m, p, 8);
  return static_cast<__mmask64>(m);
}

// Output row m, rows nb .. nb + kPackRows, from the packed block at blk: int32 lane r sums row
// r's products, so the scales and biases apply as vectors and no horizontal sum is needed. Per
// block of 32 inputs each limb's sums are exact in int32. (Two blocks at once, two weight
// streams per thread, measured 20% slower.)
template <int BITS>
inline void packed_pass(const QmmI8Args& a, const unsigned char* blk, int m, int nb) {
  const int groups = a.K / a.group_size;
  const long ss = scale_bytes(a.scale_type);
  const long wbytes = pack_weight_bytes(a.group_size, BITS);
  const long gbytes = pack_group_bytes(a.group_size, BITS, a.scale_type);
  const signed char* q1 = a.xq + static_cast<long>(m) * 2 * a.K;
  const signed char* q2 = q1 + a.K;
  const float* xd = a.xd + static_cast<long>(m) * (a.K / 32);
  const float* xs = a.xsum + static_cast<long>(m) * groups;
  const __m512i low = _mm512_set1_epi8(15);
  __m512 f = _mm512_setzero_ps();
  for (int g = 0; g < groups; ++g) {
    const unsigned char* gp = blk + g * gbytes;
    const __m512 sc = load16(gp + wbytes, a.scale_type);
    for (int jb = 0; jb < a.group_size / 32; ++jb) {
      const int k0 = g * a.group_size + 32 * jb;
      // Two accumulators per limb: independent vpdpbusd chains.
      __m512i c1[2], c2[2];
      for (int h = 0; h < 2; ++h) c1[h] = c2[h] = _mm512_setzero_si512();
      if constexpr (BITS == 4) {
        // A 64-byte step: 16 rows x inputs k .. k + 3 (low nibbles) and k + 4 .. k + 7 (high).
        for (int s = 0; s < 4; ++s) {
          const int k = k0 + 8 * s;
          const __m512i v = _mm512_loadu_si512(gp + (4L * jb + s) * 64);
          const __m512i lo = _mm512_and_si512(v, low);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
          c1[0] = _mm512_dpbusd_epi32(c1[0], lo, bcast4(q1 + k));
          c1[1] = _mm512_dpbusd_epi32(c1[1], hi, bcast4(q1 + k + 4));
          c2[0] = _mm512_dpbusd_epi32(c2[0], lo, bcast4(q2 + k));
          c2[1] = _mm512_dpbusd_epi32(c2[1], hi, bcast4(q2 + k + 4));
        }
      } else if constexpr (BITS == 5 || BITS == 6) {
        // The 4-bit layout's steps, then a mask per bit above the nibble, step and half: its
        // set bits add 16 (32) to the byte-wide values, which then meet the activations as
        // 8-bit weights' do (qmm.cpp pack_planes).
        const unsigned char* bp = gp + 64L * BITS * jb;
        const __m512i c16 = _mm512_set1_epi8(16), c32 = _mm512_set1_epi8(32);
        for (int s = 0; s < 4; ++s) {
          const int k = k0 + 8 * s;
          const __m512i v = _mm512_loadu_si512(bp + 64L * s);
          __m512i lo = _mm512_and_si512(v, low);
          __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
          const unsigned char* pl = bp + 256 + 16L * s;
          lo = _mm512_mask_add_epi8(lo, mask64(pl), lo, c16);
          hi = _mm512_mask_add_epi8(hi, mask64(pl + 8), hi, c16);
          if constexpr (BITS == 6) {
            lo = _mm512_mask_add_epi8(lo, mask64(pl + 64), lo, c32);
            hi = _mm512_mask_add_epi8(hi, mask64(pl + 72), hi, c32);
          }
          c1[0] = _mm512_dpbusd_epi32(c1[0], lo, bcast4(q1 + k));
          c1[1] = _mm512_dpbusd_epi32(c1[1], hi, bcast4(q1 + k + 4));
          c2[0] = _mm512_dpbusd_epi32(c2[0], lo, bcast4(q2 + k));
          c2[1] = _mm512_dpbusd_epi32(c2[1], hi, bcast4(q2 + k + 4));
        }
      } else {
        // A 64-byte step: 16 rows x inputs k .. k + 3.
        for (int s = 0; s < 8; ++s) {
          const int k = k0 + 4 * s;
          const __m512i v = _mm512_loadu_si512(gp + (8L * jb + s) * 64);
          c1[s & 1] = _mm512_dpbusd_epi32(c1[s & 1], v, bcast4(q1 + k));
          c2[s & 1] = _mm512_dpbusd_epi32(c2[s & 1], v, bcast4(q2 + k));
        }
      }
      const __m512i t = _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(c1[0], c1[1]), 7),
                                         _mm512_add_epi32(c2[0], c2[1]));
      f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(sc, _mm512_set1_ps(xd[k0 >> 5])), f);
    }
    f = _mm512_fmadd_ps(load16(gp + wbytes + kPackRows * ss, a.scale_type), _mm512_set1_ps(xs[g]),
                        f);
  }
  const int left = a.N - nb;
  const __mmask16 keep = left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
  _mm512_mask_storeu_ps(a.out + static_cast<long>(m) * a.N + nb, keep, f);
}

// Rows [n0, n1) (n0 a multiple of kPackRows) for every m, from the packed layout at a.w.
template <int BITS>
inline void packed_impl(const QmmI8Args& a, int n0, int n1) {
  const long block_bytes =
      (a.K / a.group_size) * pack_group_bytes(a.group_size, BITS, a.scale_type);
  for (int nb = n0; nb < n1; nb += kPackRows) {
    const unsigned char* blk = a.w + (nb / kPackRows) * block_bytes;
    for (int m = 0; m < a.M; ++m) packed_pass<BITS>(a, blk, m, nb);
  }
}

inline void qmm_i8_packed_rows(const QmmI8Args& a, int n0, int n1) {
  switch (a.bits) {
    case 4:
      packed_impl<4>(a, n0, n1);
      break;
    case 5:
      packed_impl<5>(a, n0, n1);
      break;
    case 6:
      packed_impl<6>(a, n0, n1);
      break;
    default:
      packed_impl<8>(a, n0, n1);
  }
}
#endif

#if defined(LMX_I8_MADDUBS)
// The AVX2 kernel over tiles of kTileRows weight rows for any number of x rows, on MLX's layout:
// each tile's weights are unpacked, widened to int16 and transposed in registers once per block
// of 32 inputs, then reused by up to kTileX x rows, so a call of M rows costs far less than M
// calls of one. Per x row: vpmaddwd of the weights with the activations as one int16, x16 = 128
// q1 + q2 (|x16| <= 127 * 128 + 64 = 16320), 2 inputs per int32 lane, exact (32 * 255 * 16320 <
// 2^31): one multiply per 16 products where vpmaddubsw needs one per limb, and 8-bit weights
// need no split (vpmaddubsw's int16 pair sums overflow on them).
constexpr int kTileRows = 8;
constexpr int kTileX = 32;
constexpr int kTileVecs = 16;      // int16 weight vectors per tile and block
constexpr int kTileMaxBlocks = 4;  // blocks of 32 per group (group size <= 128)

// Block j (32 inputs) of the tile's rows wr[0 .. 8) as int16. 4-bit: wv[4 s + c], s = 0 .. 3
// (inputs 8 s .. 8 s + 7), holds rows c | c + 4 in its two 128-bit lanes, one input per int16 in
// order. 8-bit: wv[2 s + h], s = 0 .. 7 (inputs 4 s .. 4 s + 3), int32 lanes rows 2 h, 2 h, 2 h
// + 1, 2 h + 1 | the same + 4, inputs (0, 1) then (2, 3).
template <int BITS>
inline void tile_weights(const unsigned char* const* wr, int j, __m256i* wv) {
  const __m256i zero = _mm256_setzero_si256();
  if constexpr (BITS == 4) {
    // Dword s of a row: inputs 8 s .. 8 s + 7, two a byte, low nibble first.
    __m256i y[4];
    for (int r = 0; r < 4; ++r)
      y[r] = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wr[r] + 16 * j))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(wr[r + 4] + 16 * j)), 1);
    // 4 x 4 dword transposes in each 128-bit lane: d[s] holds dword s of rows 0-3 | 4-7.
    const __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpackhi_epi32(y[0], y[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(y[2], y[3]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
    const __m256i d[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                          _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
    const __m256i low = _mm256_set1_epi8(15);
    for (int s = 0; s < 4; ++s) {
      // lo: inputs 0, 2, 4, 6 of each dword, hi: 1, 3, 5, 7; interleaved: 8 bytes in order per
      // row, rows 0, 1 | 4, 5 (p) and 2, 3 | 6, 7 (q).
      const __m256i lo = _mm256_and_si256(d[s], low);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(d[s], 4), low);
      const __m256i p = _mm256_unpacklo_epi8(lo, hi), q = _mm256_unpackhi_epi8(lo, hi);
      wv[4 * s + 0] = _mm256_unpacklo_epi8(p, zero);
      wv[4 * s + 1] = _mm256_unpackhi_epi8(p, zero);
      wv[4 * s + 2] = _mm256_unpacklo_epi8(q, zero);
      wv[4 * s + 3] = _mm256_unpackhi_epi8(q, zero);
    }
  } else {
    __m256i y[8];
    for (int r = 0; r < 8; ++r)
      y[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[r] + 32 * j));
    // Per 4 rows (0-3, then 4-7): 4 x 4 dword transposes in each lane; u[4 h + s] = dword s of
    // rows 4 h .. 4 h + 3 | dword s + 4 of them.
    __m256i u[8];
    for (int h = 0; h < 2; ++h) {
      const __m256i* z = y + 4 * h;
      const __m256i t0 = _mm256_unpacklo_epi32(z[0], z[1]), t1 = _mm256_unpackhi_epi32(z[0], z[1]);
      const __m256i t2 = _mm256_unpacklo_epi32(z[2], z[3]), t3 = _mm256_unpackhi_epi32(z[2], z[3]);
      u[4 * h + 0] = _mm256_unpacklo_epi64(t0, t2);
      u[4 * h + 1] = _mm256_unpackhi_epi64(t0, t2);
      u[4 * h + 2] = _mm256_unpacklo_epi64(t1, t3);
      u[4 * h + 3] = _mm256_unpackhi_epi64(t1, t3);
    }
    for (int s = 0; s < 4; ++s) {
      const __m256i a = _mm256_permute2x128_si256(u[s], u[4 + s], 0x20);  // dword s, all rows
      const __m256i b = _mm256_permute2x128_si256(u[s], u[4 + s], 0x31);  // dword s + 4
      wv[2 * s] = _mm256_unpacklo_epi8(a, zero);
      wv[2 * s + 1] = _mm256_unpackhi_epi8(a, zero);
      wv[2 * s + 8] = _mm256_unpacklo_epi8(b, zero);
      wv[2 * s + 9] = _mm256_unpackhi_epi8(b, zero);
    }
  }
}

// One x row's int32 sums of a block, rows 0, 1, 2, 3 | 4, 5, 6, 7: sum_k w_k x16_k over the
// block's 32 inputs at x (int16).
template <int BITS>
inline __m256i tile_dot(const __m256i* wv, const short* x) {
  if constexpr (BITS == 4) {
    // Per row c | c + 4, 4 lanes each summing 2 inputs of each of the 4 dwords.
    __m256i c[4];
    for (int r = 0; r < 4; ++r) c[r] = _mm256_setzero_si256();
    for (int s = 0; s < 4; ++s) {
      const __m256i xv = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 8 * s)));  // inputs 8 s .. + 7
      for (int r = 0; r < 4; ++r)
        c[r] = _mm256_add_epi32(c[r], _mm256_madd_epi16(wv[4 * s + r], xv));
    }
    return _mm256_hadd_epi32(_mm256_hadd_epi32(c[0], c[1]), _mm256_hadd_epi32(c[2], c[3]));
  } else {
    __m256i lo = _mm256_setzero_si256(), hi = lo;
    for (int s = 0; s < 8; ++s) {
      long long v;
      __builtin_memcpy(&v, x + 4 * s, 8);
      const __m256i xv = _mm256_set1_epi64x(v);  // inputs 4 s .. 4 s + 3, as the lanes pair them
      lo = _mm256_add_epi32(lo, _mm256_madd_epi16(wv[2 * s], xv));
      hi = _mm256_add_epi32(hi, _mm256_madd_epi16(wv[2 * s + 1], xv));
    }
    return _mm256_hadd_epi32(lo, hi);
  }
}

// Rows [n0, n1) for every m, from a.x16, a.xd and a.xsum. sb: the tile's scales and biases
// transposed (groups x 8 each), one row's converted values (groups), kTileX x 8 accumulators.
template <int BITS>
inline void tile_impl(const QmmI8Args& a, int n0, int n1, float* sb) {
  const int groups = a.K / a.group_size, per_group = a.group_size / 32;
  const long K = a.K;  // locals: the stores to acc could alias a's fields
  const long row_bytes = K * BITS / 8;
  const long ss = a.scale_type == ScaleType::f32 ? 4 : 2;
  const short* x16 = a.x16;
  const float* xd = a.xd;
  float* sc = sb;                         // (groups, 8)
  float* bi = sc + kTileRows * groups;    // (groups, 8)
  float* one = bi + kTileRows * groups;   // (groups)
  float* acc = one + kTileRows * groups;  // (kTileX, 8)
  for (int nb = n0; nb < n1; nb += kTileRows) {
    const int rows = n1 - nb < kTileRows ? n1 - nb : kTileRows;
    const unsigned char* wr[kTileRows];
    for (int r = 0; r < kTileRows; ++r) {
      const int n = nb + (r < rows ? r : rows - 1);  // short tiles repeat their last row
      wr[r] = a.w + n * row_bytes;
      to_float(static_cast<const char*>(a.scales) + static_cast<long>(n) * groups * ss,
               a.scale_type, groups, one);
      for (int g = 0; g < groups; ++g) sc[g * kTileRows + r] = one[g];
      to_float(static_cast<const char*>(a.biases) + static_cast<long>(n) * groups * ss,
               a.scale_type, groups, one);
      for (int g = 0; g < groups; ++g) bi[g * kTileRows + r] = one[g];
    }
    // Each weight byte is read once per call: at few x rows the tile asks for the next tile's
    // bytes (a task's rows span few 4 KiB pages, where the hardware prefetcher stops).
    const bool fetch = a.M <= 8 && nb + 2 * kTileRows <= a.N;
    for (int m0 = 0; m0 < a.M; m0 += kTileX) {
      const int mc = a.M - m0 < kTileX ? a.M - m0 : kTileX;
      for (int i = 0; i < mc; ++i) _mm256_storeu_ps(acc + 8 * i, _mm256_setzero_ps());
      for (int g = 0; g < groups; ++g) {
        // The group's blocks unpacked first, so that each x row's accumulator is read and
        // written once per group, its bias term included.
        __m256i wv[kTileMaxBlocks][kTileVecs];
        if (fetch)  // the next tile's group, as fast as this one's is consumed
          for (int r = 0; r < kTileRows; ++r)
            for (long b = 0; b < a.group_size * BITS / 8; b += 64)
              __builtin_prefetch(wr[r] + kTileRows * row_bytes + g * a.group_size * BITS / 8 + b);
        for (int jb = 0; jb < per_group; ++jb) tile_weights<BITS>(wr, g * per_group + jb, wv[jb]);
        const __m256 sv = _mm256_loadu_ps(sc + g * kTileRows);
        const __m256 bv = _mm256_loadu_ps(bi + g * kTileRows);
        const short* x = x16 + m0 * K + static_cast<long>(g) * a.group_size;
        const float* d = xd + m0 * (K / 32) + g * per_group;
        const float* xs = a.xsum + static_cast<long>(m0) * groups + g;
        for (int i = 0; i < mc; ++i, x += K, d += K / 32, xs += groups) {
          __m256 f = _mm256_fmadd_ps(bv, _mm256_set1_ps(*xs), _mm256_loadu_ps(acc + 8 * i));
          for (int jb = 0; jb < per_group; ++jb) {
            const __m256i p = tile_dot<BITS>(wv[jb], x + 32 * jb);
            f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(sv, _mm256_set1_ps(d[jb])), f);
          }
          _mm256_storeu_ps(acc + 8 * i, f);
        }
      }
      for (int i = 0; i < mc; ++i) {
        float* o = a.out + static_cast<long>(m0 + i) * a.N + nb;
        if (rows == kTileRows)
          _mm256_storeu_ps(o, _mm256_loadu_ps(acc + 8 * i));
        else
          __builtin_memcpy(o, acc + 8 * i, static_cast<unsigned long>(rows) * 4);
      }
    }
  }
}

inline void qmm_i8_tile_rows(const QmmI8Args& a, int n0, int n1, float* sb) {
  if (a.bits == 4)
    tile_impl<4>(a, n0, n1, sb);
  else
    tile_impl<8>(a, n0, n1, sb);
}
#endif

inline void qmm_i8_rows(const QmmI8Args& a, int n0, int n1, float* sb) {
  if (a.bits == 4)
    rows_impl<4>(a, n0, n1, sb);
  else
    rows_impl<8>(a, n0, n1, sb);
}

}  // namespace lmx::kernels::cpu::LMX_QMM_NS
