// lmx command line: a thin layer over the library.
#include <cstdio>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "lmx/lmx.h"

namespace {

constexpr const char* kUsage = R"(usage: lmx <command> [flags]

commands:
  generate   generate text from a prompt
  convert    convert a Hugging Face model or a GGUF file to MLX format
  bench      measure prompt and decode speed and peak memory
  chat       chat with a model in the terminal
  serve      serve the model over HTTP (OpenAI and Anthropic APIs)
  embed      embed texts (Qwen3-Embedding checkpoints), printed as JSON
  lora       fine-tune a LoRA adapter (mlx_lm.lora's flags and config)
  fuse       fuse an adapter into its base model (mlx_lm.fuse)
  get        download a model from the Hugging Face hub into the local cache
  ls         list the models in the local Hugging Face cache
  rm         remove a model from the local Hugging Face cache
  fit        whether a model and a context fit in memory (nothing is loaded)

--model takes a model directory or a Hugging Face repo id (org/name[@revision]), found in the
cache or downloaded (docs/hub.md).

lmx <command> --help shows the flags of a command. lmx --version prints the version and backend.
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace lmx::cli;
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 1;
  }
  const std::string cmd = argv[1];
  const Args args(argv + 2, argv + argc);
  try {
    if (cmd == "-h" || cmd == "--help" || cmd == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (cmd == "--version" || cmd == "version") {
      std::printf("lmx %s (%s)\ndefault tier: %s; --exact: %s\n", lmx::version().c_str(),
                  lmx::backend_description().c_str(), lmx::tier_description().c_str(),
                  lmx::tier_description({.exact = true}).c_str());
      return 0;
    }
    if (cmd == "generate") return cmd_generate(args);
    if (cmd == "convert") return cmd_convert(args);
    if (cmd == "bench") return cmd_bench(args);
    if (cmd == "chat") return cmd_chat(args);
    if (cmd == "serve") return cmd_serve(args);
    if (cmd == "embed") return cmd_embed(args);
    if (cmd == "lora") return cmd_lora(args);
    if (cmd == "fuse") return cmd_fuse(args);
    if (cmd == "get") return cmd_get(args);
    if (cmd == "ls") return cmd_ls(args);
    if (cmd == "rm") return cmd_rm(args);
    if (cmd == "fit") return cmd_fit(args);
    std::fprintf(stderr, "lmx: unknown command '%s'\n\n%s", cmd.c_str(), kUsage);
    return 1;
  } catch (const lmx::Error& e) {
    std::fprintf(stderr, "lmx: error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lmx: error: %s\n", e.what());
  }
  return 1;
}
