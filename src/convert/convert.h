// `lmx convert`: a Hugging Face safetensors checkpoint or a GGUF file to an MLX model directory
// (config.json, model.safetensors or shards + index, tokenizer files, generation_config.json).
// docs/convert.md describes the rules; the HF path reproduces mlx_lm.convert bit for bit.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace lmx::convert {

struct ConvertOptions {
  std::filesystem::path src;  // HF model directory or .gguf file
  std::filesystem::path dst;  // must not exist (or be an empty directory)
  // mlx_lm.convert flags. For GGUF, -q quantizes the tensors stored as float (F32/F16/BF16).
  bool quantize = false;
  std::optional<int> q_bits;        // default 4
  std::optional<int> q_group_size;  // default 64
  // float16 | bfloat16 | float32. HF default: config.json torch_dtype (else keep). GGUF default:
  // float32: the f16 block scales are exact in it (as in float16, not bfloat16), and on MLX's CPU
  // backend float32 quantized matmuls run ~40x faster than float16 ones.
  std::optional<std::string> dtype;

  // GGUF only. Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K blocks are repacked (group 32, same q);
  // Q6_K is dequantized and re-quantized with mx::quantize.
  int gguf_requant_bits = 0;         // 0: Q6_K at 8 bits; N: every k-quant re-quantized at N
  int gguf_requant_group_size = 32;  // k-quant sub-blocks hold 16-32 weights
  bool gguf_kquant_float = false;    // keep k-quants as float (--dtype) instead
  bool gguf_dequantize = false;      // every tensor as float: no quantization in the output
  bool verbose = true;               // progress lines on stderr
};

// True when `path` is a file starting with the GGUF magic.
bool is_gguf(const std::filesystem::path& path);

void convert_hf(const ConvertOptions& opt);
void convert_gguf(const ConvertOptions& opt);
// Picks convert_gguf or convert_hf from the source. Throws lmx::Error on any problem.
void convert(const ConvertOptions& opt);

}  // namespace lmx::convert
