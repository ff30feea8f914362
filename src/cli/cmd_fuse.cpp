// lmx fuse: mlx_lm.fuse's flags (docs/training.md).
#include <cstdio>

#include "cli/commands.h"
#include "cli/flags.h"
#include "core/error.h"
#include "train/fuse.h"

namespace lmx::cli {

int cmd_fuse(const Args& args) {
  Flags f("fuse",
          "Fuse a LoRA / DoRA / full fine-tune adapter into its base model, as mlx_lm.fuse:\n"
          "quantized layers are re-quantized with their own spec unless --dequantize.",
          {
              {"model", "base model directory or hub repo id", false, "PATH|REPO", "mlx_model"},
              {"adapter-path", "the adapter directory", false, "DIR", "adapters"},
              {"save-path", "where the fused model is written (must not exist)", false, "DIR",
               "fused_model"},
              {"dequantize", "write every quantized layer as float", true},
              offline_flag(),
          });
  if (!f.parse(args)) {
    std::fputs(f.usage().c_str(), stdout);
    return 0;
  }
  try {
    train::FuseOptions o;
    o.model = f.has("model") ? resolve_model_flag(f) : std::string("mlx_model");
    o.adapter_path = f.str("adapter-path", "adapters");
    o.save_path = f.str("save-path", "fused_model");
    o.dequantize = f.on("dequantize");
    std::printf("Loading pretrained model\n");
    train::fuse(o);
    std::printf("Fused model saved to %s\n", o.save_path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lmx fuse: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace lmx::cli
