// lmx convert: flags mirror mlx_lm.convert; the GGUF-only flags start with --gguf-.
#include <cstdio>

#include "cli/commands.h"
#include "cli/flags.h"
#include "convert/convert.h"
#include "core/error.h"

namespace lmx::cli {

int cmd_convert(const Args& args) {
  Flags f("convert",
          "Convert a Hugging Face model directory (config.json + *.safetensors) or a GGUF file to\n"
          "an MLX model directory. HF input gives the same tensors as mlx_lm.convert. GGUF\n"
          "Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K blocks are repacked into MLX affine group-32\n"
          "quantization (lossless with the default float32 scales); Q6_K is dequantized and\n"
          "re-quantized. See docs/convert.md.",
          {
              {"hf-path", "source: HF model directory, .gguf file or hub repo id org/name[@rev]",
               false, "PATH|REPO"},
              {"model", "alias of --hf-path", false, "PATH"},
              {"mlx-path", "destination directory (must not exist)", false, "DIR", "mlx_model"},
              {"quantize", "quantize, also -q (HF: Linear/Embedding weights; GGUF: float matrices)",
               true},
              {"q", "(-q) short for --quantize", true},
              {"q-bits", "bits per weight for -q", false, "N", "4"},
              {"q-group-size", "group size for -q", false, "N", "64"},
              {"dtype", "float16, bfloat16 or float32 for float tensors and scales", false, "TYPE",
               "HF: config torch_dtype; GGUF: float32"},
              {"gguf-requant-bits", "re-quantize every k-quant tensor at N bits", false, "N",
               "only Q6_K, at 8"},
              {"gguf-requant-group-size", "group size for re-quantized k-quant tensors", false, "N",
               "32"},
              {"gguf-kquant-float", "keep k-quant tensors as float (--dtype) instead", true},
              {"gguf-dequantize", "write every GGUF tensor as float (no quantization)", true},
              {"quiet", "no progress lines on stderr", true},
              offline_flag(),
          });
  if (!f.parse(args)) {
    std::fputs(f.usage().c_str(), stdout);
    return 0;
  }
  try {
    convert::ConvertOptions o;
    check(f.has("hf-path") || f.has("model"), "lmx convert", "missing required flag --hf-path");
    o.src = resolve_model_flag(f, f.has("hf-path") ? "hf-path" : "model");
    o.dst = f.str("mlx-path", "mlx_model");
    o.quantize = f.on("quantize") || f.on("q");
    o.q_bits = f.opt_integer("q-bits");
    o.q_group_size = f.opt_integer("q-group-size");
    if (f.has("dtype")) o.dtype = f.str("dtype");
    o.gguf_requant_bits = f.integer("gguf-requant-bits", 0);
    o.gguf_requant_group_size = f.integer("gguf-requant-group-size", 32);
    o.gguf_kquant_float = f.on("gguf-kquant-float");
    o.gguf_dequantize = f.on("gguf-dequantize");
    o.verbose = !f.on("quiet");
    convert::convert(o);
  } catch (const Error& e) {
    std::fprintf(stderr, "lmx convert: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lmx convert: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace lmx::cli
