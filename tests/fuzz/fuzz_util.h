// Shared pieces of the libFuzzer targets: a per-process scratch directory for parsers that read
// files, and the rule that a parser may only fail with its documented error types.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>

namespace lmx::fuzz {

// /tmp/lmx-fuzz-<pid>/, created once, removed at exit.
const std::filesystem::path& scratch_dir();
// Writes `data` to scratch_dir()/name (replacing it) and returns the path.
std::filesystem::path write_scratch(const std::string& name, std::string_view data);

template <typename... Es>
bool is_one_of(const std::exception_ptr&) requires(sizeof...(Es) == 0) {
  return false;
}
template <typename E, typename... Rest>
bool is_one_of(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const E&) {
    return true;
  } catch (...) {
    return is_one_of<Rest...>(p);
  }
}

[[noreturn]] void unexpected(const char* target, const std::exception_ptr& p);

// Runs `f`; the exception types listed are the parser's clean errors. Anything else escaping
// (a std::out_of_range, a nlohmann type_error...) is a finding: it is printed and the process
// aborts, so libFuzzer keeps the input.
template <typename... Expected, typename F>
void expect_only(const char* target, F&& f) {
  try {
    f();
  } catch (...) {
    const std::exception_ptr p = std::current_exception();
    if (!is_one_of<Expected...>(p)) unexpected(target, p);
  }
}

}  // namespace lmx::fuzz
