// Typed reads of config.json fields with errors that name the file and key.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/error.h"

namespace lmx {

using json = nlohmann::json;

json read_json_file(const std::filesystem::path& path);

// A JSON object together with the file it came from, for error messages.
struct JsonView {
  const json& j;
  std::string source;

  bool has(const std::string& key) const { return j.contains(key) && !j.at(key).is_null(); }

  template <typename T>
  T get(const std::string& key) const {
    check(has(key), source, "missing required key '", key, "'");
    try {
      return j.at(key).get<T>();
    } catch (const nlohmann::json::exception&) {
      fail(source, "key '", key, "' has the wrong type: ", j.at(key).dump());
    }
  }

  template <typename T>
  T get(const std::string& key, T fallback) const {
    return has(key) ? get<T>(key) : fallback;
  }

  template <typename T>
  std::optional<T> get_opt(const std::string& key) const {
    if (!has(key)) return std::nullopt;
    return get<T>(key);
  }
};

}  // namespace lmx
