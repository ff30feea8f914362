// Quantized matmul for MLX affine weights on the CPU (tier L3): out = x @ dequantize(w).T with
// float32 accumulation, SIMD kernels chosen at run time, work spread over a persistent pool.
#pragma once

#include <mlx/mlx.h>

#include <optional>
#include <string>

#include "kernels/cpu/qmm_args.h"

namespace lmx::kernels::cpu {

namespace mx = mlx::core;

// Kernel instruction sets, widest first. LMX_CPU_ISA=avx512|avx2|generic forces one (an error
// when the CPU lacks it).
enum class Isa { avx512, avx2, generic };
std::string isa_name(Isa isa);
bool isa_available(Isa isa);
Isa active_isa();  // LMX_CPU_ISA, else the widest the CPU has

struct QmmOptions {
  int group_size = 64;
  int bits = 4;
  std::optional<Isa> isa;              // unset: active_isa()
  std::optional<mx::Dtype> out_dtype;  // unset: the result type of x and the scales
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

// Building blocks of the fused kernels (kernels/cpu/fused.cpp), for use inside an eval task.
struct QWeight {
  const unsigned char* w;
  const void* scales;
  const void* biases;
  ScaleType scale_type;
  int N, K, group_size, bits;
};
// Pointers into evaluated, row-contiguous arrays (an error otherwise).
QWeight qweight(const mx::array& w, const mx::array& scales, const mx::array& biases,
                int group_size, int bits);
IsaKernels kernels_for(Isa isa);  // an error when the CPU or the build lacks it
// x (M, K) float32, row-major -> out (M, N) float32, spread over the thread pool.
void qmm_f32(const QWeight& w, const float* x, int M, float* out, Isa isa);
// An evaluated float array (..., K) of any layout -> (M, K) float32 rows.
void to_f32_rows(const mx::array& x, float* out);
// float32 values -> out's buffer in out's dtype (out.size() values).
void from_f32(const float* src, mx::array& out);

}  // namespace lmx::kernels::cpu
