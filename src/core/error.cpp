#include "core/error.h"

namespace lmx {

Error::Error(std::string_view where, std::string_view what)
    : std::runtime_error("[" + std::string(where) + "] " + std::string(what)), where_(where) {}

}  // namespace lmx
