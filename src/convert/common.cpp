#include "convert/common.h"

#include "core/error.h"

namespace lmx::convert {

std::optional<mx::Dtype> parse_dtype(const std::string& name) {
  if (name == "float16") return mx::float16;
  if (name == "bfloat16") return mx::bfloat16;
  if (name == "float32") return mx::float32;
  return std::nullopt;
}

std::string dtype_label(mx::Dtype dtype) {
  if (dtype == mx::float16) return "float16";
  if (dtype == mx::bfloat16) return "bfloat16";
  if (dtype == mx::float32) return "float32";
  return "other";
}

void check_quant_params(int bits, int group_size) {
  check(bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8, "convert",
        "quantization bits ", bits, " is not supported, expected 2, 3, 4, 5, 6 or 8");
  check(group_size == 32 || group_size == 64 || group_size == 128, "convert",
        "quantization group size ", group_size, " is not supported, expected 32, 64 or 128");
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace lmx::convert
