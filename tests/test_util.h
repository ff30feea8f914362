// Shared helpers for the gtest binaries.
#pragma once

#include <filesystem>
#include <string>

namespace lmx::test {

// Generated test data (tiny models, reference outputs): $LMX_TEST_DATA, made by scripts/test.sh.
// Fails the calling test (no skip) when the directory or the entry is missing.
std::filesystem::path data_dir();
std::filesystem::path data_path(const std::string& relative);
std::filesystem::path source_dir();
std::filesystem::path lmx_binary();

struct RunResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs the lmx binary with arguments (each already shell-quoted by the caller or plain words).
RunResult run_lmx(const std::string& args);
// The same with environment assignments ("NAME=value NAME2=value") for the binary.
RunResult run_lmx_env(const std::string& env, const std::string& args);

}  // namespace lmx::test
