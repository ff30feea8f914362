// CLI subcommands: each takes the arguments after its name and returns the exit code.
#pragma once

#include <string>
#include <vector>

#include "cli/flags.h"
#include "lmx/lmx.h"

namespace lmx::cli {

using Args = std::vector<std::string>;

int cmd_generate(const Args& args);

// The sampling flags shared by generate and bench, and the options they set.
std::vector<FlagSpec> sampling_flags();
GenerateOptions generate_options(const Flags& flags);
// mlx-lm's --kv-bits, --kv-group-size, --quantized-kv-start and --kv-config (generate and bench;
// a kv_config file is checked against the loaded model).
std::vector<FlagSpec> kv_cache_flags();
void set_kv_cache_options(const Flags& flags, const LanguageModel& model, GenerateOptions& options);
int cmd_convert(const Args& args);
int cmd_bench(const Args& args);
int cmd_embed(const Args& args);

}  // namespace lmx::cli
