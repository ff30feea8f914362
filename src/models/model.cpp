#include "models/model.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>

#include "core/error.h"
#include "core/heap.h"
#include "kernels/cpu/qmm.h"
#include "kernels/cuda/qmm.h"
#include "lora/lora.h"
#include "nn/adapter_router.h"

namespace lmx {

namespace fs = std::filesystem;

namespace {

std::map<std::string, Architecture>& registry() {
  static std::map<std::string, Architecture> r;
  return r;
}

}  // namespace

WeightStore::WeightStore(Weights weights, QuantConfig quant, std::string source)
    : weights_(std::move(weights)), quant_(std::move(quant)), source_(std::move(source)) {}

mx::array WeightStore::take(const std::string& key, const mx::Shape& shape) {
  check(!released_.count(key), source_, "tensor '", key,
        "' taken again after its layer replaced it (WeightStore::release)");
  auto it = weights_.find(key);
  check(it != weights_.end(), source_, "missing tensor '", key, "', expected shape ",
        shape_str(shape));
  check(it->second.shape() == shape, source_, "tensor '", key, "' has shape ",
        shape_str(it->second.shape()), ", expected ", shape_str(shape));
  used_.insert(key);
  return it->second;
}

void WeightStore::release(const std::string& key) {
  check(used_.count(key) > 0, source_, "tensor '", key, "' released before it was taken");
  auto it = weights_.find(key);
  if (it != weights_.end()) {
    // The store's handle is the last one where the layer replaced the tensor.
    if (it->second.is_donatable()) released_bytes_ += it->second.nbytes();
    weights_.erase(it);
  }
  released_.insert(key);
  if (released_bytes_ >= (size_t{16} << 20)) {
    trim_heap();
    released_bytes_ = 0;
  }
}

std::optional<mx::array> WeightStore::take_optional(const std::string& key,
                                                    const mx::Shape& shape) {
  if (!has(key) && !released_.count(key)) return std::nullopt;
  return take(key, shape);
}

std::optional<QuantSpec> WeightStore::quant_for(const std::string& path, int in_dims) const {
  auto it = quant_.modules.find(path);
  if (it != quant_.modules.end()) return it->second;
  auto scales = weights_.find(path + ".scales");
  if (scales == weights_.end()) return std::nullopt;
  check(quant_.defaults.has_value(), source_, "tensor '", path,
        ".scales' exists but config.json has no 'quantization' block");
  // mlx-lm infer_quant_config: bits and group size follow from the packed shapes.
  QuantSpec s = *quant_.defaults;
  auto w = weights_.find(path + ".weight");
  check(w != weights_.end(), source_, "missing tensor '", path, ".weight'");
  const int s_cols = scales->second.shape(-1);
  const int w_cols = w->second.shape(-1);
  check(s_cols > 0 && in_dims % s_cols == 0, source_, "tensor '", path, ".scales' has shape ",
        shape_str(scales->second.shape()), ", which does not divide the input size ", in_dims);
  s.group_size = in_dims / s_cols;
  s.bits = (w_cols * 32) / in_dims;
  // Only affine keeps its scales in a float dtype; each other mode allows one (bits, group).
  if (scales->second.dtype() != mx::uint8) {
    s.mode = "affine";
  } else if (s.bits == 4 && s.group_size == 16) {
    s.mode = "nvfp4";
  } else if (s.bits == 4 && s.group_size == 32) {
    s.mode = "mxfp4";
  } else if (s.bits == 8 && s.group_size == 32) {
    s.mode = "mxfp8";
  } else {
    fail(source_, "cannot infer the quantization mode of '", path, "': ", s.bits,
         " bits with group size ", s.group_size,
         ", expected 4/16 (nvfp4), 4/32 (mxfp4) or 8/32 (mxfp8) for uint8 scales");
  }
  return s;
}

void WeightStore::check_all_used() const {
  std::vector<std::string> extra;
  for (const auto& [k, v] : weights_)
    if (!used_.count(k)) extra.push_back(k);
  if (extra.empty()) return;
  std::sort(extra.begin(), extra.end());
  std::string list;
  for (size_t i = 0; i < extra.size() && i < 5; ++i) list += (i ? ", " : "") + extra[i];
  if (extra.size() > 5) list += ", ... (" + std::to_string(extra.size()) + " in all)";
  fail(source_, "unexpected tensors not used by the model: ", list);
}

mx::array HiddenTap::select(const mx::array& h) const {
  if (!position) return h;
  const int L = h.shape(1);
  const int at = *position < 0 ? L + *position : *position;
  check(at >= 0 && at < L, "hidden tap", "position ", *position, " is outside the ", L,
        " positions of this forward");
  return mx::slice(h, {0, at, 0}, {h.shape(0), at + 1, h.shape(2)});
}

void HiddenTap::on_layer(int layer, const mx::array& h) {
  if (layers.count(layer)) layer_states.insert_or_assign(layer, select(h));
}

void HiddenTap::on_final(const mx::array& h) {
  if (final_norm) final_state = select(h);
}

mx::array Model::embed(const mx::array&) const {
  fail("model",
       "this architecture does not expose its token embedding, expected a dense "
       "decoder (llama, qwen2, qwen3 and their kin)");
}

mx::array Model::head(const mx::array&) const {
  fail("model",
       "this architecture does not expose its LM head, expected a dense decoder "
       "(llama, qwen2, qwen3 and their kin)");
}

Cache Model::make_cache() const {
  Cache c;
  for (int i = 0; i < num_layers(); ++i) c.push_back(std::make_unique<KVCache>());
  return c;
}

void register_architecture(const std::string& model_type, Architecture arch) {
  registry()[model_type] = std::move(arch);
}

const Architecture* find_architecture(const std::string& model_type) {
  auto it = registry().find(model_type);
  return it == registry().end() ? nullptr : &it->second;
}

std::vector<std::string> registered_architectures() {
  std::vector<std::string> names;
  for (const auto& [k, v] : registry()) names.push_back(k);
  return names;
}

namespace {

std::vector<int> read_eos(const json& v) {
  std::vector<int> ids;
  if (v.is_number_integer()) ids.push_back(v.get<int>());
  if (v.is_array())
    for (const auto& x : v)
      if (x.is_number_integer()) ids.push_back(x.get<int>());
  return ids;
}

}  // namespace

LoadedWeights load_model(const fs::path& dir, const LoadOptions& options,
                         const std::optional<ShardSpec>& shard) {
  check(fs::is_directory(dir), dir.string(), "model directory does not exist");
  const fs::path config_path = dir / "config.json";
  check(fs::exists(config_path), config_path.string(), "config.json not found");
  json config = read_json_file(config_path);
  const std::string source = config_path.string();
  check(config.is_object(), source, "config.json is not a JSON object");
  check(config.contains("model_type") && config["model_type"].is_string(), source,
        "missing required key 'model_type'");

  ModelInfo info;
  info.model_type = config["model_type"].get<std::string>();
  // mlx-lm load_config: generation_config.json's eos_token_id overrides config.json's.
  if (config.contains("eos_token_id")) info.eos_token_ids = read_eos(config["eos_token_id"]);
  const fs::path gen_path = dir / "generation_config.json";
  if (fs::exists(gen_path)) {
    try {
      json gen = read_json_file(gen_path);
      if (gen.is_object() && gen.contains("eos_token_id")) {
        auto ids = read_eos(gen["eos_token_id"]);
        if (!ids.empty()) info.eos_token_ids = ids;
      }
    } catch (const Error&) {
      // mlx-lm ignores a garbled generation_config.json.
    }
  }
  if (config.contains("max_position_embeddings") &&
      config["max_position_embeddings"].is_number_integer())
    info.max_position_embeddings = config["max_position_embeddings"].get<int>();

  const Architecture* arch = find_architecture(info.model_type);
  if (!arch) {
    std::string known;
    for (const auto& n : registered_architectures()) known += (known.empty() ? "" : ", ") + n;
    fail(source, "unsupported model_type '", info.model_type, "', expected one of: ", known);
  }
  const bool sharded = shard && shard->size > 1;
  std::unique_ptr<lora::Adapter> adapter;
  if (options.adapter_path) {
    check(!sharded, options.adapter_path->string(),
          "LoRA adapters with tensor parallelism are not supported, expected --tp 1");
    adapter = lora::Adapter::open(*options.adapter_path);
  }
  Weights weights = load_model_weights(dir);
  if (arch->sanitize) {
    // The tensors sanitize computes (stacked experts, moved axes, shifted norms) are evaluated
    // here: MLX runs a lazy array on the stream of the thread that made it, so one left for the
    // scheduler's thread fails there ("There is no Stream(cpu, 0) in current thread").
    std::set<std::uintptr_t> loaded;
    for (const auto& [k, v] : weights) loaded.insert(v.id());
    arch->sanitize(config, weights);
    std::vector<mx::array> computed;
    for (const auto& [k, v] : weights)
      if (!loaded.count(v.id())) computed.push_back(v);
    mx::eval(computed);
  }
  if (adapter && adapter->full()) adapter->replace_weights(weights);
  if (adapter && !adapter->full()) adapter->bind(weights);
  WeightStore store(std::move(weights), QuantConfig::from_config(config, source), dir.string());
  if (adapter && !adapter->full()) store.set_adapters(adapter.get());
  if (shard) store.set_shard(*shard);
  if (!sharded) store.set_router(std::make_shared<nn::AdapterRouter>());
  // The L3 fused layer runs o_proj and down_proj inside one primitive, past the all-reduce a shard
  // needs after them: sharded loads run tier L1 until the fused layer learns to reduce.
  store.set_cpu_kernels(!options.exact && !sharded && mx::default_device() == mx::Device::cpu);
  store.set_cuda_kernels(!options.exact && !sharded && kernels::cuda::available() &&
                         kernels::cuda::enabled());
  LoadedWeights out;
  out.cpu_kernels = store.cpu_kernels();
  out.cuda_kernels = store.cuda_kernels();
  out.router = store.router();
  // The kernels' settings, read here so that a bad value is an error at load, not inside an eval.
  if (out.cpu_kernels) {
    (void)kernels::cpu::int8_mode();
    (void)kernels::cpu::packing();
    (void)kernels::cpu::widening();
  }
  try {
    out.model = arch->build(config, store);
    out.model->set_cpu_kernels(out.cpu_kernels);
  } catch (const json::exception& e) {
    fail(source, "invalid config: ", e.what());
  }
  check(!sharded || store.shard_consumed(), source, "model_type '", info.model_type,
        "' does not support tensor parallelism yet, expected one of llama, mistral, qwen2, qwen3");
  store.check_all_used();
  if (adapter) adapter->check_all_used();
  info.config = std::move(config);
  out.info = std::move(info);
  return out;
}

}  // namespace lmx
