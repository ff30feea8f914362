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

// Attention of G float32 query rows that share one KV head over key rows [s0, s1), reading the
// cache where it lies: K and V stored as kv_type with row strides ks and vs (elements, unit
// stride within a row). Per row g, with scores z_s = scale * K_s . q_g: m[g] = max z, l[g] =
// sum exp(z - m[g]) and out row g (D) = sum exp(z - m[g]) V_s, unnormalized, so that partial
// results over key ranges merge (fused.cpp).
constexpr int kAttnMaxD = 256;
struct AttnArgs {
  const float* q = nullptr;  // G rows, qs floats apart
  long qs = 0;
  int G = 0;
  const void* K = nullptr;
  const void* V = nullptr;
  long ks = 0, vs = 0;
  ScaleType kv_type = ScaleType::f32;
  int s0 = 0, s1 = 0, D = 0;  // s0 < s1, D <= kAttnMaxD
  float scale = 1.0f;
  float* scores = nullptr;  // G * (s1 - s0) floats of scratch
  float* out = nullptr;     // G rows, os floats apart
  long os = 0;
  float* m = nullptr;  // G floats
  float* l = nullptr;  // G floats
};
using AttnGroupFn = void (*)(const AttnArgs& a);

// The integer-dot-product path (tier L3, an approximation). Activations are quantized per block
// of 32 inputs to two int8 limbs: with step d = amax / 127, q1 = round(x / d) in [-127, 127] and
// q2 = round((x - q1 d) * 128 / d) in [-64, 64], so x ~= xhat = xd * (128 q1 + q2) with xd =
// d / 128, |x - xhat| <= amax / 32512 (a 15-bit grid; one limb, |x - xhat| <= amax / 254, fails
// the tier gates on SmolLM2: docs/cpu.md). Per weight group, w = s * q + b, so sum_k xhat_k w_k
// = s * sum_k (128 q1 + q2)_k q_k * xd + b * xsum: the integer sums from u8 x s8 dot products
// (VNNI; 4 * 255 * (127 * 128 + 64) < 2^24, so exact in int32 and in its float32 conversion), xsum
// the group sums of xhat. (Group sums of the exact x would leave an error sum_k s q_k (xhat_k -
// x_k) instead of sum_k w_k (xhat_k - x_k); s q = w - b is not centred, and that measured ~2.5x
// larger.)
struct QmmI8Args {
  // (M, 2, K): per row q1 then q2, in the kernel's order: for bits == 4 each chunk of `chunk`
  // inputs (QmmI8Kernel) is its even elements then its odd ones, the order of low and high
  // nibbles; bits == 8 in order.
  const signed char* xq = nullptr;
  const float* xd = nullptr;    // (M, K / 32): d / 128 per block
  const float* xsum = nullptr;  // (M, K / group_size): sums of xhat over each weight group
  const short* x16 = nullptr;   // (M, K): 128 q1 + q2 in input order (tile_rows)
  const unsigned char* w = nullptr;
  const void* scales = nullptr;
  const void* biases = nullptr;
  ScaleType scale_type = ScaleType::f32;
  float* out = nullptr;  // (M, N) float32
  int M = 0, N = 0, K = 0, group_size = 0, bits = 0;
};

// Rows [n0, n1) of the output for every m; sbuf: 24 * K / 32 + 256 floats of scratch.
using QmmI8RowsFn = void (*)(const QmmI8Args& a, int n0, int n1, float* sbuf);

// x (M, K) float32 -> xq (M, 2, K), xd (M, K / 32), xsum (M, K / group_size) in the kernel's
// order; bsum: K / 32 floats of scratch.
using QuantizeXFn = void (*)(const float* x, int M, int K, int group_size, int bits,
                             signed char* xq, float* xd, float* xsum, float* bsum);

// The 512-bit kernel's own weight layout, made once per weight (qmm.cpp): per block of
// kPackRows rows (the last one padded with zero rows), per group: the group's weights as 64-byte
// steps whose byte 4 r + i holds row r's input k + i (8-bit, 4 inputs a step) or inputs k + i in
// the low nibble and k + 4 + i in the high one (4-bit, 8 inputs a step; 5/6-bit: these low
// nibbles, then per block of 32 inputs a 64-bit mask per higher bit, step and half, qmm.cpp
// pack_planes), then the block's
// kPackRows scales and kPackRows biases in the scale type. Each int32 lane of a vpdpbusd then
// sums one row, so no horizontal sums and no scale broadcasts are needed.
constexpr int kPackRows = 16;
inline long scale_bytes(ScaleType t) { return t == ScaleType::f32 ? 4 : 2; }
// One group of one block: its weights, then kPackRows scales and kPackRows biases.
inline long pack_weight_bytes(int group_size, int bits) {
  return static_cast<long>(kPackRows) * group_size * bits / 8;
}
inline long pack_group_bytes(int group_size, int bits, ScaleType t) {
  return pack_weight_bytes(group_size, bits) + 2L * kPackRows * scale_bytes(t);
}
// Rows [n0, n1) of the output for every m, n0 a multiple of kPackRows, with QmmI8Args::w the
// packed layout (scales and biases unused) and xq in input order (quantize with bits = 8).
using QmmI8PackedRowsFn = void (*)(const QmmI8Args& a, int n0, int n1);

struct QmmI8Kernel {
  QmmI8RowsFn rows = nullptr;
  QuantizeXFn quantize = nullptr;
  int chunk = 32;  // inputs per vector (64 with 512-bit registers; a 32 tail when K % 64)
  QmmI8PackedRowsFn packed_rows = nullptr;  // the packed layout's kernel, where there is one
  // The widest weights it computes exactly (8: every kernel; AVX2's `rows` alone takes 4-bit
  // weights, whose vpmaddubsw pair sums 15 * 127 * 2 fit int16, and leaves 8-bit ones to
  // tile_rows).
  int max_bits = 8;
  const char* name = "";
  // AVX2's kernel over tiles of 8 weight rows on MLX's layout (qmm_i8_kernel.h, kTileRows), xq in
  // input order (quantize with bits = 8): weights unpacked once per tile and block for every x
  // row, 4- and 8-bit (its nibble split keeps the int16 sums exact). It takes the calls of at
  // least tile_min_rows rows, and every call on 8-bit weights (`rows` takes 4-bit ones only).
  QmmI8RowsFn tile_rows = nullptr;
  int tile_min_rows = 2;
};

QmmI8Kernel kernels_i8_avx512vnni();  // empty when not built for x86-64
QmmI8Kernel kernels_i8_avxvnni();     // empty when not built for x86-64
QmmI8Kernel kernels_i8_avx2();        // empty when not built for x86-64

// The largest of x[0 .. n) (-inf for n = 0) and the sum of exp(x - max) over them (0 when the
// max is -inf), summed lane-wise then across lanes: the same order for the same n.
using MaxExpSumFn = void (*)(const float* x, int n, float* max, float* sum);

// The gated MLP's middle, in place: g[j] = act(g[j]) * u[j] for j < n, act silu (gelu = false:
// x / (1 + e^-x)) or mlx.nn.gelu_approx (0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))),
// taken as x / (1 + e^-2y), the same function). Each element's result depends on its values
// only, not on its position.
using GateActFn = void (*)(float* g, const float* u, long n, bool gelu);

struct IsaKernels {
  QmmRowsFn qmm_rows = nullptr;
  AttnGroupFn attn_group = nullptr;
  MaxExpSumFn max_exp_sum = nullptr;
  GateActFn gate_act = nullptr;
};

IsaKernels kernels_generic();
IsaKernels kernels_avx2();    // empty when not built for x86-64
IsaKernels kernels_avx512();  // empty when not built for x86-64

}  // namespace lmx::kernels::cpu
