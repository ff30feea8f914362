// Quantized matmul for MLX affine weights on the CPU (tier L3): out = x @ dequantize(w).T with
// float32 accumulation, SIMD kernels chosen at run time, work spread over a persistent pool.
#pragma once

#include <mlx/mlx.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "kernels/cpu/qmm_args.h"

namespace lmx::kernels::cpu {

namespace mx = mlx::core;

// Kernel instruction sets, widest first. LMX_CPU_ISA=avx512|avx2|generic forces one (an error
// when the CPU lacks it).
enum class Isa { avx512, avx2, generic };
std::string isa_name(Isa isa);
bool isa_available(Isa isa);
Isa active_isa();  // LMX_CPU_ISA, else the widest the CPU has

// The integer path of the kernels (QmmI8Args): activations quantized to int8 per block of 32
// inputs, u8 x s8 dot products with VNNI, for 4- and 8-bit weights on a CPU with AVX512-VNNI
// (under Isa::avx512) or AVX-VNNI, and on AVX2 (vpmaddubsw for one row, int16 tiles of 8 weight
// rows for more rows and 8-bit weights). An approximation of the float32 kernel, which stays its
// reference (docs/cpu.md). best: where it is measured faster than the float32 kernel, every
// call on the packed layout (packing()) and on AVX2's tiles, else calls of at most
// kInt8MaxRows rows (decode, short verifies); all: every call.
enum class Int8Mode { off, best, all };
constexpr int kInt8MaxRows = 8;
// LMX_CPU_INT8=0|1|all (off, best, all); unset: best.
Int8Mode int8_mode();
// Overrides the environment for the graphs built after it (tests, A/B runs); nullopt: back to it.
void set_int8_mode(std::optional<Int8Mode> mode);
// Whether the AVX512-VNNI kernel runs on its own packed copy of each weight (qmm_args.h
// kPackRows), made on the weight's first int8 call and kept while the weight lives: about 1.3x
// faster decode for a second copy of the weights in memory. LMX_CPU_PACK=0|1 (unset: 1);
// set_packing overrides it for the calls that follow (tests, A/B runs).
bool packing();
void set_packing(bool on);
// Whether 5- and 6-bit weights take the int8 path as a byte-wide copy (widened_weight): MLX's
// 5/6-bit packing crosses bytes, which the int8 kernels do not unpack. Off, they take the float32
// kernel. Also whether a load widens MXFP4 weights (widen_mxfp4) onto the kernels; off, they
// stay on MLX's ops. LMX_CPU_WIDEN=0|1 (unset: 1); set_widening overrides it for the calls and
// loads that follow.
bool widening();
void set_widening(bool on);
// The int8 kernel quantized matmuls under `isa` use: "avx512vnni", "avxvnni", "avx2", or "" for
// none.
std::string int8_kernel_name(Isa isa);
int int8_max_bits(Isa isa);  // the widest weights that kernel takes (0: none)
// Whether that kernel runs on packed weight copies under `isa` (packing() and a kernel for them).
bool int8_packed(Isa isa);
// Whether that kernel takes calls of every row count under Int8Mode::best (packed, or AVX2's
// tiles), rather than at most kInt8MaxRows rows.
bool int8_all_rows(Isa isa);

struct QmmOptions {
  int group_size = 64;
  int bits = 4;
  std::optional<Isa> isa;              // unset: active_isa()
  std::optional<mx::Dtype> out_dtype;  // unset: the result type of x and the scales
  std::optional<Int8Mode> int8;        // unset: int8_mode()
};

// Whether quantized_matmul handles this layout: affine mode, bits 2/3/4/5/6/8, groups 32/64/128,
// scales of float32, bfloat16 or float16.
bool supports(int bits, int group_size, const std::string& mode, mx::Dtype scale_dtype);

// x (..., K) float32/bfloat16/float16; w (N, K * bits / 32) uint32; scales, biases (N, K / gs).
// Returns (..., N) in the result type of x and scales, as mx::quantized_matmul. Runs on the CPU.
mx::array quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, const QmmOptions& opt);

// The plain-MLX computation quantized_matmul stands for, in float32: dequantize, then matmul.
mx::array quantized_matmul_reference(const mx::array& x, const mx::array& w,
                                     const mx::array& scales, const mx::array& biases,
                                     int group_size, int bits);

// An MXFP4 weight (MLX's mode "mxfp4": 4-bit e2m1 values, one uint8 e8m0 scale per group of 32,
// no biases) as the 8-bit affine layout every kernel reads, made once at load. Twice an e2m1
// value is an integer in -12..12 and half an e8m0 scale is a power of two, so the byte 2v + 12
// with scale 2^(e - 128) and bias -12 * 2^(e - 128) dequantizes to MLX's value bit for bit. A
// copy rather than an e2m1 unpack in the kernels: the float, int8 (u8 x s8) and packed kernels of
// each ISA all take it unchanged. The cost is memory and bandwidth: 1 + 1/8 bytes per weight
// (bfloat16 scales and biases) where MLX's layout holds 17/32.
struct AffineWeight {
  mx::array w, scales, biases;
};
// w (..., N, K / 8) uint32, scales (..., N, K / 32) uint8 -> w (..., N, K / 4) uint32 (one byte
// per value), scales and biases (..., N, K / 32) bfloat16: group size 32, 8 bits. nullopt where a
// scale byte is above 251 (scales of 2^125 and up, and e8m0's NaN 255: 24 * 2^(e - 128)
// overflows float32 where MLX's value need not), for such a weight to stay on MLX's ops.
// Evaluates w and scales; bad shapes or dtypes are errors.
std::optional<AffineWeight> widen_mxfp4(const mx::array& w, const mx::array& scales);

// Building blocks of the fused kernels (kernels/cpu/fused.cpp), for use inside an eval task.
struct QWeight {
  const unsigned char* w;
  const void* scales;
  const void* biases;
  ScaleType scale_type;
  int N, K, group_size, bits;
  std::weak_ptr<void> owner;  // w's buffer: names the weight for its packed copy (qmm.cpp)
};
// Pointers into evaluated, row-contiguous arrays (an error otherwise).
QWeight qweight(const mx::array& w, const mx::array& scales, const mx::array& biases,
                int group_size, int bits);
IsaKernels kernels_for(Isa isa);  // an error when the CPU or the build lacks it
// w's packed copy (qmm_args.h kPackRows), made on first use and kept while w.owner lives; a
// weight 4- or 8-bit with its group size dividing K, or 5/6-bit: then the packed copy of its
// byte-wide copy (an 8-bit layout), which is made for the packing only and not kept.
const unsigned char* packed_weight(const QWeight& w);
// The bytes of the kernels' own weight copies alive now (packed, byte-wide), for tests and
// memory accounting.
// in_place: the packed copies that replaced MLX's bytes (pack_in_place).
struct KernelCopies {
  size_t packed = 0, widened = 0, in_place = 0;
};
KernelCopies kernel_copies();
// Tier L3's single copy of a weight (issue 26): where w's calls run on the packed kernel
// (packing() and the int8 path on for active_isa(), a 2-D 4- or 8-bit weight, or 5/6-bit where
// widening()), an array of w's shape and dtype whose buffer holds w's packed copy (larger than
// the shape says: padding rows, the scales and biases, a byte per 5/6-bit weight) in place of
// MLX's layout, known to packed_weight by that buffer. The caller replaces w by it, so MLX's
// bytes go once nothing else holds them. nullopt otherwise. The kernels' other paths (the float
// kernel, the unpacked int8 kernels: LMX_CPU_INT8=0 or set_packing(false) after the load)
// rebuild MLX's layout for each call, packed_take gathers rows of it; stock MLX ops must not
// read it. consume: the caller drops w for the result, so where w is the only handle on its
// buffer (array::is_donatable) its pages are handed back as they are packed (4/8-bit): w holds
// garbage after it. Evaluates w, scales and biases.
std::optional<mx::array> pack_in_place(const mx::array& w, const mx::array& scales,
                                       const mx::array& biases, int group_size, int bits,
                                       bool consume = false);
bool packed_in_place(const mx::array& w);  // whether w came from pack_in_place and lives
// Stand-ins for the scales and biases of a weight from pack_in_place, whose packed copy holds
// them too: arrays of their shape and dtype over address space only (reading them faults). The
// kernels and packed_take take them from the packed copy; the caller drops MLX's for these, and
// the weight is then known to the kernels with these scales only. nullopt where w is not packed
// in place.
std::optional<std::pair<mx::array, mx::array>> scales_in_place(const mx::array& w);
enum class PackedPart { weight, scales, biases };
// Rows `ids` (any integer dtype, each in 0..N-1) of a weight from pack_in_place, in MLX's layout
// and bit for bit mx::take(original, ids, 0): (ids..., K * bits / 32) uint32; or of its scales
// or biases, (ids..., K / group_size) in their dtype. Runs on the CPU.
mx::array packed_take(const mx::array& w, const mx::array& ids,
                      PackedPart part = PackedPart::weight);
// A 5- or 6-bit weight's copy with one byte per weight (values 0..31 / 0..63, MLX's 8-bit
// layout; the same scales and biases) as an 8-bit QWeight, made on first use and kept while
// w.owner lives; any other weight as it is.
QWeight widened_weight(const QWeight& w);
// Makes the packed copy now (a load, not the first call) where this layer's calls will use it:
// the int8 path on, the packed kernel for active_isa(), 4- or 8-bit weights, and 5/6-bit ones
// where widening(); else a 5/6-bit weight's byte-wide copy (widened_weight) where widening()
// and an int8 kernel (the unpacked int8 kernels read it). Evaluates w, scales and biases.
void prepack(const mx::array& w, const mx::array& scales, const mx::array& biases, int group_size,
             int bits);
// x (M, K) float32, row-major -> out (M, N) float32, spread over the thread pool; through the
// int8 path when `int8` selects it for M rows and the layout and CPU allow it.
void qmm_f32(const QWeight& w, const float* x, int M, float* out, Isa isa, Int8Mode int8);
// n weights over the same x (Q/K/V, gate/up): outs[i] (M, ws[i].N). Weights of one layout (K,
// bits, group size) share one conversion of x and one parallel_for; the results equal n calls
// of qmm_f32.
void qmm_f32_shared(const QWeight* ws, int n, const float* x, int M, float* const* outs, Isa isa,
                    Int8Mode int8);
// An evaluated float array (..., K) of any layout -> (M, K) float32 rows.
void to_f32_rows(const mx::array& x, float* out);
// float32 values -> out's buffer in out's dtype (out.size() values).
void from_f32(const float* src, mx::array& out);

// n (weight, x rows) pairs as one parallel_for (a MoE layer's experts): outs[i] (Ms[i], ws[i].N)
// from xs[i] (Ms[i], ws[i].K); each pair takes the path qmm_f32 takes for its rows and gives
// its result. Pairs of 0 rows are skipped.
void qmm_f32_pairs(const QWeight* ws, int n, const float* const* xs, const int* Ms,
                   float* const* outs, Isa isa, Int8Mode int8);

}  // namespace lmx::kernels::cpu
