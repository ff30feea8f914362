// GGUF block formats onto MLX affine quantization (w = scale * q + bias per group of 32).
//
// These ggml blocks are affine in groups of 32 already:
//   Q4_0 w = d*(q-8)        -> scale d, bias -8d          Q4_1 w = d*q + m  -> scale d, bias m
//   Q5_0 w = d*(q-16)       -> scale d, bias -16d         Q5_1 w = d*q + m  -> scale d, bias m
//   Q8_0 w = d*q (int8 q)   -> q' = q+128, bias -128d
//   Q4_K / Q5_K: 256-weight super-blocks of 8 sub-blocks of 32, w = (d*sc)*q - dmin*m with 6-bit
//   sc, m -> per sub-block scale d*sc, bias -(dmin*m)
// d, dmin and m are f16, so every scale and bias is exact in float32 (products of an f16 and a
// small integer); in float16 the legacy ones are exact short of overflow, the k-quant products
// usually are not; bfloat16 rarely holds any. Q6_K (sub-blocks of 16) has no such mapping.
#pragma once

#include <mlx/mlx.h>

#include <optional>
#include <vector>

#include "io/gguf.h"

namespace lmx::convert {

namespace mx = mlx::core;

struct AffineTensor {
  mx::array weight;  // uint32 [rows, cols * bits / 32]
  mx::array scales;  // dtype [rows, cols / group_size]
  mx::array biases;  // dtype [rows, cols / group_size]
  int bits = 4;
  int group_size = 32;
};

// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K.
bool is_affine_block_type(gguf::GGMLType t);
int affine_block_bits(gguf::GGMLType t);

struct Repacked {
  AffineTensor tensor;
  // Every scale and bias is exact in the dtype, so dequantizing gives gguf-py's values bit for
  // bit. When false they were rounded to the dtype (relative error <= 2^-11 for float16, 2^-8
  // for bfloat16), which is still closer than re-quantizing: the grid is the block's own.
  bool exact = false;
};

// Repacks a 2-D tensor of an affine block type into MLX layout with group size 32, keeping every
// q. `row_order`, when given, lists for each output row the source row (the llama Q/K
// un-permutation moves whole rows; blocks never cross rows). Returns nullopt when a scale or bias
// overflows the dtype (the caller then re-quantizes from the float values).
std::optional<Repacked> repack_affine_blocks(const gguf::File& file, const gguf::TensorInfo& t,
                                             mx::Dtype dtype,
                                             const std::vector<int64_t>* row_order = nullptr);

// mx::quantize of a float [rows, cols] matrix, scales and biases cast to `dtype`.
AffineTensor quantize_float(const mx::array& w, int bits, int group_size, mx::Dtype dtype);

}  // namespace lmx::convert
