#include "core/json.h"

#include <fstream>

namespace lmx {

json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  check(in.good(), path.string(), "cannot open file");
  try {
    return json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    fail(path.string(), "invalid JSON: ", e.what());
  }
}

}  // namespace lmx
