// lmx fuse: an adapter folded into its base model, as mlx_lm.fuse writes it. LoRA: W + (scale *
// lora_b^T) @ lora_a^T; DoRA: that, rescaled per output row by m / ||row||; full: the adapter's
// tensors replace the checkpoint's. A quantized module is dequantized, fused and re-quantized with
// its own spec (group size, bits, mode) unless --dequantize, which writes the whole model float.
#pragma once

#include <filesystem>

namespace lmx::train {

struct FuseOptions {
  std::filesystem::path model;
  std::filesystem::path adapter_path = "adapters";
  std::filesystem::path save_path = "fused_model";
  bool dequantize = false;
};

// Writes save_path (model.safetensors + index, config.json, and the model directory's other files:
// tokenizer, chat template, generation config). Throws lmx::Error for an adapter that does not
// fit the model (checked by loading it as lmx generate would) or an existing save_path.
void fuse(const FuseOptions& options);

}  // namespace lmx::train
