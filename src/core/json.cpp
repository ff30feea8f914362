#include "core/json.h"

#include <fstream>

namespace lmx {

json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  check(in.good(), path.string(), "cannot open file");
  try {
    return json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for a number too large for a double (1e999).
    fail(path.string(), "invalid JSON: ", e.what());
  }
}

}  // namespace lmx
