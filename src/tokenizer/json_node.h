// Typed access to tokenizer.json sections: every error names the file and the dotted path of the
// field ("[/m/tokenizer.json] pre_tokenizer.pretokenizers[1].type: unsupported ...").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "core/json.h"

namespace lmx::tok {

class Node {
 public:
  Node(const json& j, std::shared_ptr<const std::string> file, std::string path)
      : j_(&j), file_(std::move(file)), path_(std::move(path)) {}

  const json& raw() const { return *j_; }
  const std::string& file() const { return *file_; }
  const std::string& path() const { return path_; }
  bool is_null() const { return j_->is_null(); }

  template <typename... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    lmx::fail(*file_, path_.empty() ? "(top level)" : path_, ": ", parts...);
  }

  // Present and not null.
  bool has(std::string_view key) const {
    if (!j_->is_object()) return false;
    auto it = j_->find(key);
    return it != j_->end() && !it->is_null();
  }
  Node at(std::string_view key) const {
    if (!j_->is_object()) fail("expected an object, got ", kind(*j_));
    auto it = j_->find(key);
    if (it == j_->end()) child_path_fail(key, "missing required field");
    return Node(*it, file_, join(key));
  }
  // Null when absent.
  Node get(std::string_view key) const {
    static const json kNull;
    if (!j_->is_object()) return Node(kNull, file_, join(key));
    auto it = j_->find(key);
    return Node(it == j_->end() ? kNull : *it, file_, join(key));
  }
  size_t size() const {
    if (!j_->is_array()) fail("expected an array, got ", kind(*j_));
    return j_->size();
  }
  Node operator[](size_t i) const {
    return Node((*j_)[i], file_, path_ + "[" + std::to_string(i) + "]");
  }

  std::string as_string() const {
    if (!j_->is_string()) fail("expected a string, got ", kind(*j_));
    return j_->get<std::string>();
  }
  bool as_bool() const {
    if (!j_->is_boolean()) fail("expected a boolean, got ", kind(*j_));
    return j_->get<bool>();
  }
  int64_t as_int() const {
    if (!j_->is_number_integer()) fail("expected an integer, got ", kind(*j_));
    return j_->get<int64_t>();
  }

  std::string str(std::string_view key) const { return at(key).as_string(); }
  std::string str(std::string_view key, std::string fallback) const {
    return has(key) ? at(key).as_string() : std::move(fallback);
  }
  std::optional<std::string> opt_str(std::string_view key) const {
    if (!has(key)) return std::nullopt;
    return at(key).as_string();
  }
  bool boolean(std::string_view key, bool fallback) const {
    return has(key) ? at(key).as_bool() : fallback;
  }
  int64_t integer(std::string_view key, int64_t fallback) const {
    return has(key) ? at(key).as_int() : fallback;
  }
  // The component's "type" tag.
  std::string type() const { return str("type"); }
  [[noreturn]] void unsupported(std::string_view expected) const {
    at("type").fail("unsupported component, expected one of ", expected, ", got \"", type(), "\"");
  }

  static std::string kind(const json& j) {
    if (j.is_null()) return "null";
    if (j.is_boolean()) return "a boolean";
    if (j.is_number()) return "a number";
    if (j.is_string()) return "a string";
    if (j.is_array()) return "an array";
    return "an object";
  }

 private:
  std::string join(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }
  [[noreturn]] void child_path_fail(std::string_view key, std::string_view what) const {
    lmx::fail(*file_, join(key), ": ", what);
  }

  const json* j_;
  std::shared_ptr<const std::string> file_;
  std::string path_;
};

}  // namespace lmx::tok
