// CLI subcommands: each takes the arguments after its name and returns the exit code.
#pragma once

#include <string>
#include <vector>

namespace lmx::cli {

using Args = std::vector<std::string>;

int cmd_generate(const Args& args);
int cmd_convert(const Args& args);
int cmd_bench(const Args& args);

}  // namespace lmx::cli
