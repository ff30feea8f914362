#include "test_util.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace lmx::test {

namespace fs = std::filesystem;

fs::path data_dir() {
  const char* env = std::getenv("LMX_TEST_DATA");
  fs::path dir = env ? fs::path(env) : fs::path(LMX_DEFAULT_TEST_DATA);
  if (!fs::is_directory(dir)) {
    ADD_FAILURE() << "test data directory " << dir
                  << " is missing: run scripts/test.sh (it generates the references)";
  }
  return dir;
}

fs::path data_path(const std::string& relative) {
  fs::path p = data_dir() / relative;
  if (!fs::exists(p)) ADD_FAILURE() << "test data " << p << " is missing";
  return p;
}

fs::path source_dir() { return fs::path(LMX_SOURCE_DIR); }
fs::path lmx_binary() { return fs::path(LMX_BINARY); }

RunResult run_lmx(const std::string& args) { return run_lmx_env("", args); }

RunResult run_lmx_env(const std::string& env, const std::string& args) {
  RunResult r;
  fs::path err_file = fs::temp_directory_path() / ("lmx_test_err_" + std::to_string(::getpid()));
  std::string cmd = (env.empty() ? "" : "env " + env + " ") + lmx_binary().string() + " " + args +
                    " 2>" + err_file.string();
  if (args.find('<') == std::string::npos) cmd += " </dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream e(err_file);
  std::stringstream ss;
  ss << e.rdbuf();
  r.err = ss.str();
  fs::remove(err_file);
  return r;
}

}  // namespace lmx::test
