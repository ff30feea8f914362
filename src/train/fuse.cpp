#include "train/fuse.h"

#include <cstdio>

#include "convert/mlx_writer.h"
#include "core/error.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "lmx/lmx.h"
#include "lora/lora.h"
#include "models/model.h"

namespace lmx::train {

namespace fs = std::filesystem;

namespace {

std::optional<QuantSpec> spec_of(const QuantConfig& q, const std::string& module) {
  if (auto it = q.modules.find(module); it != q.modules.end() && it->second) return it->second;
  return q.defaults;
}

mx::array dequantized(const Weights& w, const std::string& module, const QuantSpec& s) {
  std::optional<mx::array> biases;
  if (auto it = w.find(module + ".biases"); it != w.end()) biases = it->second;
  return mx::dequantize(w.at(module + ".weight"), w.at(module + ".scales"), biases, s.group_size,
                        s.bits, s.mode);
}

}  // namespace

void fuse(const FuseOptions& o) {
  check(!fs::exists(o.save_path), o.save_path.string(),
        "the save path already exists, expected a new directory");
  // The adapter must load onto the model as lmx generate loads it (names, shapes, keys).
  (void)load_model(o.model, {.exact = true, .adapter_path = o.adapter_path});

  const fs::path config_path = o.model / "config.json";
  convert::ojson config = convert::read_ojson(config_path);
  const json plain = json::parse(config.dump());
  const std::string type = plain.at("model_type").get<std::string>();
  const Architecture* arch = find_architecture(type);
  check(arch != nullptr, config_path.string(), "unsupported model_type '", type, "'");
  Weights weights = load_model_weights(o.model);
  if (arch->sanitize) arch->sanitize(plain, weights);
  const QuantConfig quant = QuantConfig::from_config(plain, config_path.string());

  const lora::AdapterConfig ac = lora::read_adapter_config(o.adapter_path);
  const fs::path adapter_file = o.adapter_path / "adapters.safetensors";
  if (ac.fine_tune_type == "full") {
    auto adapter = lora::Adapter::open(o.adapter_path);
    adapter->replace_weights(weights);
  } else {
    const Weights adapter = load_safetensors(adapter_file);
    int fused = 0;
    for (const auto& [name, a] : adapter) {
      if (!name.ends_with(".lora_a")) continue;
      const std::string module = name.substr(0, name.size() - 7);
      check(a.ndim() == 2 && weights.count(module + ".weight"), adapter_file.string(), "'", module,
            "' is not a linear layer; fusing embedding or expert adapters is not "
            "supported yet");
      const mx::array& b = adapter.at(module + ".lora_b");
      const bool quantized = weights.count(module + ".scales") > 0;
      std::optional<QuantSpec> spec = quantized ? spec_of(quant, module) : std::nullopt;
      check(!quantized || spec, config_path.string(), "no quantization spec for '", module, "'");
      const mx::array w =
          quantized ? dequantized(weights, module, *spec) : weights.at(module + ".weight");
      // (scale * lora_b^T) @ lora_a^T in the adapter's dtype, added in the weight's.
      const mx::array delta = mx::matmul(
          mx::multiply(mx::array(ac.scale, b.dtype()), mx::transpose(b)), mx::transpose(a));
      mx::array out = mx::add(w, mx::astype(delta, w.dtype()));
      if (ac.fine_tune_type == "dora") {
        const mx::array& m = adapter.at(module + ".m");
        mx::array norm_scale = mx::divide(m, mx::linalg::norm(out, std::vector<int>{1}));
        out = mx::multiply(mx::expand_dims(norm_scale, 1), out);
      }
      if (quantized && !o.dequantize) {
        auto q = mx::quantize(out, spec->group_size, spec->bits, spec->mode);
        weights.insert_or_assign(module + ".weight", q[0]);
        weights.insert_or_assign(module + ".scales", q[1]);
        if (q.size() > 2) weights.insert_or_assign(module + ".biases", q[2]);
      } else {
        weights.insert_or_assign(module + ".weight", out);
        weights.erase(module + ".scales");
        weights.erase(module + ".biases");
      }
      ++fused;
    }
    check(fused > 0, adapter_file.string(), "no lora_a tensors to fuse");
  }
  if (o.dequantize) {
    std::vector<std::string> modules;
    for (const auto& [name, a] : weights)
      if (name.ends_with(".scales")) modules.push_back(name.substr(0, name.size() - 7));
    for (const auto& module : modules) {
      auto spec = spec_of(quant, module);
      check(spec.has_value(), config_path.string(), "no quantization spec for '", module, "'");
      weights.insert_or_assign(module + ".weight", dequantized(weights, module, *spec));
      weights.erase(module + ".scales");
      weights.erase(module + ".biases");
    }
    config.erase("quantization");
    config.erase("quantization_config");
  }
  convert::QuantMap qmap;
  for (const auto& [name, a] : weights)
    if (name.ends_with(".scales")) {
      const std::string module = name.substr(0, name.size() - 7);
      auto spec = spec_of(quant, module);
      qmap[module] = {spec->group_size, spec->bits};
    }

  convert::StagingDir out(o.save_path);
  convert::save_weights(out.path(), weights, qmap);
  convert::save_config(out.path() / "config.json", config);
  for (const auto& e : fs::directory_iterator(o.model)) {
    const std::string n = e.path().filename().string();
    if (!e.is_regular_file() || n == "config.json" || n.ends_with(".safetensors") ||
        n == "model.safetensors.index.json" || n.ends_with(".py"))
      continue;
    fs::copy_file(e.path(), out.path() / n);
  }
  out.commit();
}

}  // namespace lmx::train
