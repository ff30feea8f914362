#include "core/error.h"

namespace lmx {

namespace {
std::string format(std::string_view where, std::string_view what) {
  std::string s;
  s.reserve(where.size() + what.size() + 3);
  s.append(1, '[').append(where).append("] ").append(what);
  return s;
}
}  // namespace

Error::Error(std::string_view where, std::string_view what)
    : std::runtime_error(format(where, what)), where_(where) {}

}  // namespace lmx
