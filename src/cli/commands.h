// CLI subcommands: each takes the arguments after its name and returns the exit code.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cli/flags.h"
#include "lmx/lmx.h"

namespace lmx::cli {

using Args = std::vector<std::string>;

int cmd_generate(const Args& args);

// --offline, and the directory a model reference flag names: a directory as it is, or a Hugging
// Face repo id (org/name[@revision]) from the cache, downloaded when missing (src/hub).
FlagSpec offline_flag();
std::string resolve_model_flag(const Flags& flags, const std::string& flag = "model");

// The sampling flags shared by generate and bench, and the options they set.
std::vector<FlagSpec> sampling_flags();
// --adapter-path DIR (generate, chat, bench, serve) and its value for LoadOptions.
FlagSpec adapter_path_flag();
std::optional<std::filesystem::path> adapter_path(const Flags& flags);
GenerateOptions generate_options(const Flags& flags);
// mlx-lm's --kv-bits, --kv-group-size, --quantized-kv-start and --kv-config (generate and bench;
// a kv_config file is checked against the loaded model).
std::vector<FlagSpec> kv_cache_flags();
void set_kv_cache_options(const Flags& flags, const LanguageModel& model, GenerateOptions& options);
// --tp N and --tp-timeout S (generate, bench; serve when it lands).
std::vector<FlagSpec> tensor_parallel_flags();
int tensor_parallel_size(const Flags& flags);
// With --tp N > 1 in the launching process: runs `lmx <command> args` as N ranks (lmx.h
// launch_ranks) and returns true once all exited 0. False in a rank or without --tp.
bool launched_ranks(const Flags& flags, const std::string& command, const Args& args,
                    const std::string& prompt = "");
// mlx-lm's --draft-model DIR --num-draft-tokens K, and --prompt-lookup N (generate, chat, bench).
std::vector<FlagSpec> speculative_flags();
// Loads the draft model (same tier as the target) and sets the speculative options; checks K
// and that both proposers are not given.
void set_speculative_options(const Flags& flags, const LanguageModel& model, bool exact,
                             GenerateOptions& options);
// "speculative: R rounds, D drafted, A accepted (X%), mean accepted length L", or "" without.
std::string speculative_summary(const GenerateOptions& options, const SpeculativeStats& s);
int cmd_convert(const Args& args);
int cmd_bench(const Args& args);
int cmd_chat(const Args& args);
int cmd_serve(const Args& args);
int cmd_embed(const Args& args);
int cmd_lora(const Args& args);
int cmd_fuse(const Args& args);
int cmd_get(const Args& args);
int cmd_ls(const Args& args);
int cmd_rm(const Args& args);
int cmd_fit(const Args& args);

}  // namespace lmx::cli
