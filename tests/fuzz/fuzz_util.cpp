#include "fuzz_util.h"

#include <unistd.h>

#include <fstream>

namespace lmx::fuzz {

namespace fs = std::filesystem;

const fs::path& scratch_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("lmx-fuzz-" + std::to_string(getpid()));
    fs::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return dir;
}

fs::path write_scratch(const std::string& name, std::string_view data) {
  const fs::path p = scratch_dir() / name;
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out) {
    std::fprintf(stderr, "[fuzz] cannot write %s\n", p.c_str());
    std::abort();
  }
  return p;
}

void unexpected(const char* target, const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[%s] unexpected exception: %s\n", target, e.what());
  } catch (...) {
    std::fprintf(stderr, "[%s] unexpected non-std exception\n", target);
  }
  std::abort();
}

}  // namespace lmx::fuzz
