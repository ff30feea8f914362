// config.json's `quantization` block (QuantConfig, models/model.h): apart from the loader so
// that the config fuzzer (tests/fuzz/fuzz_config.cpp) links it alone.
#include "models/model.h"

namespace lmx {

namespace {

std::optional<QuantSpec> parse_spec(const json& j, const std::string& source,
                                    const std::string& key) {
  if (j.is_boolean()) {
    check(!j.get<bool>(), source, "quantization entry '", key, "' must be false or an object");
    return std::nullopt;
  }
  check(j.is_object() && j.contains("bits") && j.contains("group_size"), source,
        "quantization entry '", key, "' needs bits and group_size, got ", j.dump());
  QuantSpec s;
  try {
    s.bits = j["bits"].get<int>();
    s.group_size = j["group_size"].get<int>();
    if (j.contains("mode") && !j["mode"].is_null()) s.mode = j["mode"].get<std::string>();
  } catch (const json::exception&) {
    fail(source, "quantization entry '", key, "' has a field of the wrong type: ", j.dump());
  }
  return s;
}

}  // namespace

QuantConfig QuantConfig::from_config(const json& config, const std::string& source) {
  QuantConfig q;
  if (!config.contains("quantization") || config["quantization"].is_null()) {
    // mlx-lm load_model's legacy quantization_config: OpenAI's MXFP4 checkpoints (gpt-oss) say
    // only quant_method; their packed modules carry .scales, the others stay float.
    if (config.contains("quantization_config") && config["quantization_config"].is_object()) {
      const json& qc = config["quantization_config"];
      const std::string method = qc.value("quant_method", std::string());
      if (method == "mxfp4") q.defaults = QuantSpec{4, 32, "mxfp4"};
      if (method == "mxfp8") q.defaults = QuantSpec{8, 32, "mxfp8"};
    }
    return q;
  }
  const json& block = config["quantization"];
  check(block.is_object(), source, "'quantization' must be an object");
  q.defaults = parse_spec(block, source, "quantization");
  for (auto it = block.begin(); it != block.end(); ++it) {
    if (it.key() == "bits" || it.key() == "group_size" || it.key() == "mode") continue;
    if (!it->is_object() && !it->is_boolean()) continue;
    q.modules[it.key()] = parse_spec(*it, source, it.key());
  }
  return q;
}

}  // namespace lmx
