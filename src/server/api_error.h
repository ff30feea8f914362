// OpenAI-shaped HTTP errors: {"error": {"message", "type", "param", "code"}} with the status.
#pragma once

#include <stdexcept>
#include <string>

namespace lmx::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "",
           std::string type = "invalid_request_error", std::string code = "")
      : std::runtime_error(message),
        status(status),
        param(std::move(param)),
        type(std::move(type)),
        code(std::move(code)) {}
  int status;
  std::string param, type, code;
};

// 400 naming the field: bad_field("temperature", "must be >= 0, got -1").
[[noreturn]] inline void bad_field(const std::string& field, const std::string& what) {
  throw ApiError(400, "'" + field + "' " + what, field);
}

}  // namespace lmx::server
