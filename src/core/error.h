// Errors as "[where] what": every failure the user can cause names the file, key, shape or field.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace lmx {

class Error : public std::runtime_error {
 public:
  Error(std::string_view where, std::string_view what);
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

// Builds the message from any streamable parts: fail("safetensors", "bad dtype ", name).
template <typename... Parts>
[[noreturn]] void fail(std::string_view where, const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw Error(where, os.str());
}

template <typename... Parts>
void check(bool ok, std::string_view where, const Parts&... parts) {
  if (!ok) fail(where, parts...);
}

}  // namespace lmx
