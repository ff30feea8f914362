#include "lora/lora.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "core/error.h"
#include "core/json.h"

namespace lmx::lora {

namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string describe_keys(const AdapterConfig& c) {
  if (!c.keys) return "every linear layer";
  std::string out = "keys [";
  for (size_t i = 0; i < c.keys->size(); ++i) out += (i ? ", " : "") + (*c.keys)[i];
  return out + "]";
}

}  // namespace

AdapterConfig read_adapter_config(const fs::path& dir) {
  const fs::path path = dir / "adapter_config.json";
  const std::string source = path.string();
  check(fs::exists(path), source, "adapter_config.json not found in the adapter directory");
  const json j = read_json_file(path);
  check(j.is_object(), source, "adapter_config.json is not a JSON object");
  check(!j.contains("peft_type"), source,
        "a PEFT (Hugging Face) adapter, expected mlx-lm's format (fine_tune_type, num_layers, "
        "lora_parameters)");
  const JsonView v{j, source};
  AdapterConfig c;
  c.fine_tune_type = v.get<std::string>("fine_tune_type", "lora");
  check(c.fine_tune_type == "lora" || c.fine_tune_type == "dora" || c.fine_tune_type == "full",
        source, "fine_tune_type must be lora, dora or full, got '", c.fine_tune_type, "'");
  c.num_layers = v.get<int>("num_layers");
  if (c.fine_tune_type == "full") return c;
  check(v.has("lora_parameters") && j.at("lora_parameters").is_object(), source,
        "missing required object 'lora_parameters' (rank, scale, dropout, keys)");
  const json& p = j.at("lora_parameters");
  const JsonView lp{p, source + ": lora_parameters"};
  check(lp.has("scale") || !lp.has("alpha"), lp.source,
        "missing required key 'scale', found 'alpha': mlx-lm's LoRA config uses 'scale' (a plain "
        "multiplier), not 'alpha'");
  c.rank = lp.get<int>("rank");
  check(c.rank > 0, lp.source, "rank must be > 0, got ", c.rank);
  c.scale = lp.get<float>("scale");
  c.dropout = lp.get<float>("dropout", 0.0f);
  if (lp.has("keys")) {
    check(p.at("keys").is_array(), lp.source, "keys must be a list of module names, got ",
          p.at("keys").dump());
    std::vector<std::string> keys;
    for (const auto& k : p.at("keys")) {
      check(k.is_string() && !k.get<std::string>().empty(), lp.source,
            "keys must be module names (strings), got ", k.dump());
      keys.push_back(k.get<std::string>());
    }
    c.keys = std::move(keys);
  }
  return c;
}

mx::array LoRALinear::operator()(const mx::array& x, const mx::array& y) const {
  mx::array z = mx::matmul(mx::matmul(x, a_), b_);
  return mx::add(y, mx::astype(mx::multiply(mx::array(scale_, z.dtype()), z), x.dtype()));
}

DoRALinear::DoRALinear(const nn::Linear& base, mx::array lora_a, mx::array lora_b, mx::array m,
                       float scale)
    : w_(base.weight),
      scales_(base.scales),
      biases_(base.biases),
      bias_(base.bias),
      quant_(base.quant),
      a_(std::move(lora_a)),
      b_(std::move(lora_b)),
      m_(std::move(m)),
      scale_(scale) {}

mx::array DoRALinear::weight() const {
  if (!quant_) return w_;
  return mx::dequantize(w_, *scales_, biases_, quant_->group_size, quant_->bits, quant_->mode);
}

mx::array DoRALinear::operator()(const mx::array& x, const mx::array&) const {
  const mx::array w = weight();
  mx::array out = mx::matmul(x, mx::transpose(w));
  mx::array z = mx::matmul(mx::matmul(x, a_), b_);
  out = mx::add(out, mx::astype(mx::multiply(mx::array(scale_, z.dtype()), z), x.dtype()));
  // ||W + scale * B^T A^T|| per output row
  mx::array delta =
      mx::matmul(mx::multiply(mx::array(scale_, b_.dtype()), mx::transpose(b_)), mx::transpose(a_));
  mx::array denom = mx::linalg::norm(mx::add(w, delta), std::vector<int>{1});
  out = mx::multiply(mx::astype(mx::divide(m_, denom), x.dtype()), out);
  return bias_ ? mx::add(out, *bias_) : out;
}

mx::array LoRAEmbedding::lookup(const mx::array& ids, const mx::array& y) const {
  mx::array z = mx::matmul(mx::take(a_, ids, 0), b_);
  return mx::add(y, mx::astype(mx::multiply(mx::array(scale_, z.dtype()), z), y.dtype()));
}

mx::array LoRAEmbedding::as_linear(const mx::array& x, const mx::array& y) const {
  mx::array z = mx::matmul(mx::matmul(x, mx::transpose(b_)), mx::transpose(a_));
  return mx::add(y, mx::astype(mx::multiply(mx::array(scale_, z.dtype()), z), x.dtype()));
}

mx::array LoRASwitchLinear::operator()(const mx::array& x, const mx::array& indices,
                                       bool sorted_indices, const mx::array& y) const {
  mx::array z = mx::gather_mm(x, mx::swapaxes(a_, -1, -2), std::nullopt, indices, sorted_indices);
  z = mx::gather_mm(z, mx::swapaxes(b_, -1, -2), std::nullopt, indices, sorted_indices);
  return mx::add(y, mx::astype(mx::multiply(mx::array(scale_, z.dtype()), z), x.dtype()));
}

std::unique_ptr<Adapter> Adapter::open(const fs::path& dir) {
  check(fs::is_directory(dir), dir.string(), "LoRA adapter directory does not exist");
  AdapterConfig config = read_adapter_config(dir);
  const fs::path file = dir / "adapters.safetensors";
  if (!fs::exists(file) && fs::exists(dir / "adapter_model.safetensors"))
    fail(file.string(),
         "not found; adapter_model.safetensors is a PEFT (Hugging Face) adapter, "
         "expected mlx-lm's adapters.safetensors");
  check(fs::exists(file), file.string(), "adapters.safetensors not found in the adapter directory");
  Weights weights = load_safetensors(file);
  check(!weights.empty(), file.string(), "the adapter has no tensors");
  return std::unique_ptr<Adapter>(new Adapter(dir, std::move(config), std::move(weights)));
}

Adapter::Adapter(fs::path dir, AdapterConfig config, Weights weights)
    : dir_(std::move(dir)), config_(std::move(config)), weights_(std::move(weights)) {}

std::string Adapter::file() const { return (dir_ / "adapters.safetensors").string(); }

void Adapter::replace_weights(Weights& checkpoint) {
  for (const auto& [name, a] : weights_) {
    auto it = checkpoint.find(name);
    check(it != checkpoint.end(), file(), "tensor '", name,
          "' is not a parameter of the model (fine_tune_type full replaces existing tensors)");
    check(it->second.shape() == a.shape(), file(), "tensor '", name, "' has shape ",
          shape_str(a.shape()), ", expected the model's ", shape_str(it->second.shape()));
    it->second = a;
    used_.insert(name);
  }
}

void Adapter::bind(const Weights& checkpoint) {
  std::vector<std::string> names;
  names.reserve(checkpoint.size());
  for (const auto& [name, a] : checkpoint) names.push_back(name);
  bind(names);
}

void Adapter::bind(const std::vector<std::string>& names) {
  // The decoder layers are "<prefix>layers.<i>.": the prefix shared by most tensors.
  std::map<std::string, std::pair<int, int>> prefixes;  // prefix -> (tensors, max index)
  for (const auto& name : names) {
    for (size_t at = name.find("layers."); at != std::string::npos;
         at = name.find("layers.", at + 1)) {
      if (at > 0 && name[at - 1] != '.') continue;
      size_t p = at + 7, q = p;
      while (q < name.size() && std::isdigit(static_cast<unsigned char>(name[q]))) ++q;
      if (q == p || q >= name.size() || name[q] != '.') continue;
      auto& [count, top] = prefixes[name.substr(0, p)];
      ++count;
      top = std::max(top, std::stoi(name.substr(p, q - p)));
      break;
    }
  }
  int best = 0;
  for (const auto& [prefix, stats] : prefixes) {
    if (stats.first <= best) continue;
    best = stats.first;
    layers_prefix_ = prefix;
    num_model_layers_ = stats.second + 1;
  }
  check(!layers_prefix_.empty(), dir_.string(),
        "the model has no 'layers.<i>.' tensors to attach the adapter to");
}

bool Adapter::selected(const std::string& path) const {
  if (config_.keys && contains(*config_.keys, path)) return true;
  if (path.rfind(layers_prefix_, 0) != 0) return false;
  const size_t p = layers_prefix_.size();
  size_t q = p;
  while (q < path.size() && std::isdigit(static_cast<unsigned char>(path[q]))) ++q;
  if (q == p || q >= path.size() || path[q] != '.') return false;
  const int layer = std::stoi(path.substr(p, q - p));
  // layers[-max(num_layers, 0):]
  const int first =
      config_.num_layers > 0 ? std::max(0, num_model_layers_ - config_.num_layers) : 0;
  if (layer < first) return false;
  return !config_.keys || contains(*config_.keys, path.substr(q + 1));
}

mx::array Adapter::take(const std::string& name, const mx::Shape& shape, const std::string& what) {
  auto it = weights_.find(name);
  const std::string module = name.substr(0, name.rfind('.'));
  check(it != weights_.end(), file(), "missing tensor '", name, "' of module '", module,
        "', which adapter_config.json selects (", config_.fine_tune_type, ", num_layers ",
        config_.num_layers, ", ", describe_keys(config_), "), expected shape ", shape_str(shape));
  check(it->second.shape() == shape, file(), "tensor '", name, "' has shape ",
        shape_str(it->second.shape()), ", expected ", shape_str(shape), " (", what, ")");
  used_.insert(name);
  return it->second;
}

std::vector<std::shared_ptr<const nn::LinearAdapter>> Adapter::linear(const std::string& path,
                                                                      const nn::Linear& base,
                                                                      int in, int out) {
  if (full() || !selected(path)) return {};
  const int r = config_.rank;
  const std::string rank = "lora_parameters.rank " + std::to_string(r);
  mx::array a = take(path + ".lora_a", {in, r}, "input " + std::to_string(in) + " x " + rank);
  mx::array b = take(path + ".lora_b", {r, out}, rank + " x output " + std::to_string(out));
  if (config_.fine_tune_type == "dora") {
    mx::array m = take(path + ".m", {out}, "the output size " + std::to_string(out));
    return {std::make_shared<DoRALinear>(base, a, b, m, config_.scale)};
  }
  return {std::make_shared<LoRALinear>(a, b, config_.scale)};
}

std::vector<std::shared_ptr<const nn::EmbeddingAdapter>> Adapter::embedding(
    const std::string& path, const nn::Embedding& base, int vocab, int dims) {
  if (full() || !selected(path)) return {};
  check(config_.fine_tune_type != "dora", dir_.string(), "DoRA on the embedding '", path,
        "' is not supported, expected fine_tune_type lora for embeddings");
  const int r = config_.rank;
  const std::string rank = "lora_parameters.rank " + std::to_string(r);
  mx::array a =
      take(path + ".lora_a", {vocab, r}, "vocabulary " + std::to_string(vocab) + " x " + rank);
  mx::array b = take(path + ".lora_b", {r, dims}, rank + " x dims " + std::to_string(dims));
  return {std::make_shared<LoRAEmbedding>(a, b, config_.scale)};
}

std::vector<std::shared_ptr<const nn::SwitchAdapter>> Adapter::switch_linear(
    const std::string& path, int in, int out, int experts) {
  if (full() || !selected(path)) return {};
  // tuner.utils.linear_to_lora_layers: "SwitchLinear doesn't support DoRA yet."
  check(config_.fine_tune_type != "dora", dir_.string(), "DoRA on the SwitchLinear '", path,
        "' is not supported (nor by mlx-lm), expected fine_tune_type lora");
  const int r = config_.rank;
  const std::string rank = "lora_parameters.rank " + std::to_string(r);
  const std::string e = std::to_string(experts) + " experts";
  mx::array a =
      take(path + ".lora_a", {experts, r, in}, e + " x " + rank + " x input " + std::to_string(in));
  mx::array b = take(path + ".lora_b", {experts, out, r},
                     e + " x output " + std::to_string(out) + " x " + rank);
  return {std::make_shared<LoRASwitchLinear>(a, b, config_.scale)};
}

void Adapter::check_all_used() const {
  std::vector<std::string> extra;
  for (const auto& [name, a] : weights_)
    if (!used_.count(name)) extra.push_back(name);
  if (extra.empty()) return;
  std::string list;
  for (size_t i = 0; i < extra.size() && i < 5; ++i) list += (i ? ", " : "") + extra[i];
  if (extra.size() > 5) list += ", ... (" + std::to_string(extra.size()) + " in all)";
  if (full()) fail(file(), "tensors not used by the model: ", list);
  fail(file(), "not adapter parameters of the model: ", list, "; adapter_config.json selects ",
       config_.fine_tune_type, " on ", describe_keys(config_), " of the last ",
       config_.num_layers > 0 ? std::min(config_.num_layers, num_model_layers_) : num_model_layers_,
       " of ", num_model_layers_, " layers (", layers_prefix_, "<i>)");
}

void load_routed(nn::AdapterRouter& router, const std::string& name, const fs::path& dir) {
  check(!name.empty(), "adapter", "the adapter name is empty, expected a name");
  check(!router.has(name), "adapter", "an adapter named '", name,
        "' is already loaded, expected a new name (unload it first)");
  std::unique_ptr<Adapter> adapter = Adapter::open(dir);
  const AdapterConfig& c = adapter->config();
  check(c.fine_tune_type == "lora", (dir / "adapter_config.json").string(), "fine_tune_type '",
        c.fine_tune_type,
        "' cannot be chosen per request, expected lora (load DoRA and full fine-tunes with "
        "--adapter-path)");
  const auto& sites = router.sites();
  std::vector<std::string> paths;
  paths.reserve(sites.size());
  for (const auto& s : sites) paths.push_back(s.path);
  adapter->bind(paths);
  nn::AdapterRouter::Modules modules;
  modules.linear.resize(sites.size());
  modules.embedding.resize(sites.size());
  int changed = 0;
  for (size_t i = 0; i < sites.size(); ++i) {
    const auto& s = sites[i];
    if (s.embedding) {
      auto a = adapter->embedding(s.path, nn::Embedding{}, s.in, s.out);
      if (!a.empty()) modules.embedding[i] = a.front();
      changed += !a.empty();
    } else {
      auto a = adapter->linear(s.path, nn::Linear{}, s.in, s.out);
      if (!a.empty()) modules.linear[i] = a.front();
      changed += !a.empty();
    }
  }
  try {
    adapter->check_all_used();
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find("switch_") != std::string::npos || what.find("experts") != std::string::npos)
      fail((dir / "adapters.safetensors").string(),
           "adapters on MoE expert layers cannot be chosen per request, expected them loaded with "
           "--adapter-path (",
           what, ")");
    throw;
  }
  router.add({name, dir, c.rank, c.scale, changed, 0}, std::move(modules));
}

}  // namespace lmx::lora
