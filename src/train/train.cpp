#include "train/train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numbers>
#include <numeric>
#include <optional>

#include "core/error.h"
#include "io/safetensors.h"
#include "lmx/lmx.h"
#include "models/model.h"
#include "nn/layers.h"
#include "nn/transformer.h"
#include "tokenizer/tokenizer.h"

namespace lmx::train {

namespace {

// The trainable arrays, which the adapters read on every forward: the loss function points them
// at value_and_grad's tracers while it runs.
struct ParamSet {
  std::vector<std::string> names;
  std::vector<mx::array> values;
  bool training = false;  // dropout on
  double dropout = 0.0;
  // Full fine-tuning: the model's own arrays, values[i] mirrored into *targets[i], and their
  // loaded values (the DPO reference).
  std::vector<mx::array*> targets;
  std::vector<mx::array> initial;
  bool reference = false;  // adapters off: the DPO reference forward
  // The PRNG key of mx.random's default sequence (KeySequence), held here so that the compiled
  // training step can take it in and hand it back, as mlx-lm's step does with mx.random.state:
  // each draw splits it as KeySequence::next() does.
  mx::array key = mx::random::key(0);

  void seed(uint64_t s) { key = mx::random::key(s); }
  mx::array next_key() {
    auto [rest, draw] = mx::random::split(key);
    key = rest;
    return draw;
  }

  void set(std::vector<mx::array> v) {
    values = std::move(v);
    sync();
  }
  void sync() {
    for (size_t i = 0; i < targets.size(); ++i) *targets[i] = values[i];
  }
};

// The decoder layer a parameter belongs to: N of "<prefix>layers.N.<rest>", else none.
std::optional<int> layer_of(const std::string& name) {
  for (size_t at = name.find("layers."); at != std::string::npos;
       at = name.find("layers.", at + 1)) {
    if (at > 0 && name[at - 1] != '.') continue;
    size_t p = at + 7, q = p;
    while (q < name.size() && std::isdigit(static_cast<unsigned char>(name[q]))) ++q;
    if (q > p && q < name.size() && name[q] == '.' && q - p < 9)
      return std::stoi(name.substr(p, q - p));
  }
  return std::nullopt;
}

// nn.Dropout when training: (bernoulli(1 - p) * x) * (1 / (1 - p)).
mx::array dropout(ParamSet& p, const mx::array& x) {
  if (!p.training || p.dropout <= 0.0) return x;
  // 1 - p and 1 / (1 - p) in double, as Python computes them, then rounded to the arrays' types.
  const double keep = 1.0 - p.dropout;
  mx::array mask =
      mx::random::bernoulli(mx::array(static_cast<float>(keep)), x.shape(), p.next_key());
  return mx::multiply(mx::multiply(mask, x), mx::array(static_cast<float>(1.0 / keep), x.dtype()));
}

// The base weight, dequantized if quantized (DoRA's _dequantized_weight).
mx::array base_weight(const nn::Linear& base) {
  if (!base.quant) return base.weight;
  return mx::dequantize(base.weight, *base.scales, base.biases, base.quant->group_size,
                        base.quant->bits, base.quant->mode);
}

// mlx-lm DoRALinear: out = x @ W^T + (scale * z).astype(x.dtype), z = (dropout(x) @ A) @ B, then
// times (m / stop_gradient(||W + scale * B^T A^T|| per row)).astype(x.dtype), the bias last.
class TrainableDoRA : public nn::LinearAdapter {
 public:
  TrainableDoRA(std::shared_ptr<ParamSet> p, const nn::Linear& base, int a, int b, int m,
                float scale)
      : p_(std::move(p)), base_(base), a_(a), b_(b), m_(m), scale_(scale) {}
  bool replaces_base() const override { return true; }
  mx::array operator()(const mx::array& x, const mx::array&) const override {
    if (p_->reference) return base_(x);
    const mx::array& A = p_->values[a_];
    const mx::array& B = p_->values[b_];
    const mx::array w = base_weight(base_);
    mx::array out = mx::matmul(x, mx::transpose(w));
    mx::array z = mx::matmul(mx::matmul(dropout(*p_, x), A), B);
    out = mx::add(out, mx::astype(mx::multiply(mx::array(scale_, z.dtype()), z), x.dtype()));
    mx::array adapted = mx::add(
        w,
        mx::matmul(mx::multiply(mx::array(scale_, B.dtype()), mx::transpose(B)), mx::transpose(A)));
    mx::array denom = mx::stop_gradient(mx::linalg::norm(adapted, std::vector<int>{1}));
    out = mx::multiply(mx::astype(mx::divide(p_->values[m_], denom), x.dtype()), out);
    return base_.bias ? mx::add(out, *base_.bias) : out;
  }

 private:
  std::shared_ptr<ParamSet> p_;
  nn::Linear base_;  // the frozen layer's arrays (shared, not copied)
  int a_, b_, m_;
  float scale_;
};

// mlx-lm LoRALinear: y + (scale * ((dropout(x) @ lora_a) @ lora_b)).astype(x.dtype).
class TrainableLoRA : public nn::LinearAdapter {
 public:
  TrainableLoRA(std::shared_ptr<ParamSet> p, int a, int b, float scale)
      : p_(std::move(p)), a_(a), b_(b), scale_(scale) {}
  mx::array operator()(const mx::array& x, const mx::array& y) const override {
    if (p_->reference) return y;
    mx::array z = mx::matmul(mx::matmul(dropout(*p_, x), p_->values[a_]), p_->values[b_]);
    return mx::add(y, mx::astype(mx::multiply(mx::array(scale_, z.dtype()), z), x.dtype()));
  }

 private:
  std::shared_ptr<ParamSet> p_;
  int a_, b_;
  float scale_;
};

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// Attaches trainable LoRA layers where linear_to_lora_layers would: the last num_layers decoder
// layers, modules among `keys` (every linear layer without keys).
class TrainSource : public nn::AdapterSource {
 public:
  struct Slot {
    std::string path, local;  // full module path; its name inside the layer
    int layer = 0, in = 0, out = 0, a = 0, b = 0, order = 0;
    int m = -1;  // DoRA's magnitude
    std::optional<nn::Linear> base;
  };

  TrainSource(std::shared_ptr<ParamSet> p, const TrainOptions& o) : p_(std::move(p)), o_(o) {}

  // The decoder layers' prefix ("model.layers.") and count, from the checkpoint's tensor names.
  void bind(const Weights& w) {
    std::map<std::string, std::pair<int, int>> prefixes;
    for (const auto& [name, a] : w) {
      const size_t at = name.find("layers.");
      if (at == std::string::npos || (at > 0 && name[at - 1] != '.')) continue;
      size_t p = at + 7, q = p;
      while (q < name.size() && std::isdigit(static_cast<unsigned char>(name[q]))) ++q;
      if (q == p || q >= name.size() || name[q] != '.') continue;
      auto& [count, top] = prefixes[name.substr(0, p)];
      ++count;
      top = std::max(top, std::stoi(name.substr(p, q - p)));
    }
    int best = 0;
    for (const auto& [prefix, stats] : prefixes)
      if (stats.first > best) {
        best = stats.first;
        prefix_ = prefix;
        layers_ = stats.second + 1;
      }
    check(layers_ > 0, o_.model.string(), "the model has no 'layers.<i>.' tensors to train");
    check(o_.num_layers <= layers_, "lmx lora", "Requested to train ", o_.num_layers,
          " layers but the model only has ", layers_, " layers.");
  }

  std::vector<std::shared_ptr<const nn::LinearAdapter>> linear(const std::string& path,
                                                               const nn::Linear& base, int in,
                                                               int out) override {
    auto local = selected(path);
    if (!local || o_.fine_tune_type == "full") return {};
    check(!base.all_reduce, path, "training a sharded layer is not supported");
    Slot s;
    s.path = path;
    s.local = local->second;
    s.layer = local->first;
    s.in = in;
    s.out = out;
    s.order = static_cast<int>(slots_.size());
    s.a = add(path + ".lora_a", {in, o_.rank});
    s.b = add(path + ".lora_b", {o_.rank, out});
    slots_.push_back(s);
    if (o_.fine_tune_type == "dora") {
      slots_.back().m = add(path + ".m", {out});
      slots_.back().base = base;
      return {std::make_shared<TrainableDoRA>(p_, base, s.a, s.b, slots_.back().m, o_.scale)};
    }
    return {std::make_shared<TrainableLoRA>(p_, s.a, s.b, o_.scale)};
  }
  std::vector<std::shared_ptr<const nn::EmbeddingAdapter>> embedding(const std::string& path,
                                                                     const nn::Embedding&, int,
                                                                     int) override {
    check(o_.fine_tune_type == "full" || !selected(path), path,
          "training LoRA on embeddings is not supported yet, expected "
          "--keys (lora_parameters.keys) without this module");
    return {};
  }
  std::vector<std::shared_ptr<const nn::SwitchAdapter>> switch_linear(const std::string& path, int,
                                                                      int, int) override {
    check(o_.fine_tune_type == "full" || !selected(path), path,
          "training LoRA on mixture-of-experts layers is not supported "
          "yet, expected lora_parameters.keys without this module");
    return {};
  }

  // mlx-lm draws each LoRALinear's parameters when it wraps the layer: the wrapped nn.Linear's
  // own uniform init (thrown away), then lora_a ~ U(-1/sqrt(in), 1/sqrt(in)); lora_b is zero.
  // Layers go in order, and within a layer in Module.named_modules() order: the reverse of the
  // attribute definition order, which for mlx-lm's llama-style blocks is the rank below. Other
  // modules keep their load order after those (the same distribution, not mlx-lm's draws).
  void initialize(int seed) {
    static const std::vector<std::string> named_modules_order = {
        "mlp.up_proj",      "mlp.down_proj",    "mlp.gate_proj",   "self_attn.o_proj",
        "self_attn.v_proj", "self_attn.k_proj", "self_attn.q_proj"};
    auto rank = [&](const Slot& s) {
      auto it = std::find(named_modules_order.begin(), named_modules_order.end(), s.local);
      return it == named_modules_order.end() ? 1000 + s.order
                                             : static_cast<int>(it - named_modules_order.begin());
    };
    std::vector<Slot> order = slots_;
    std::stable_sort(order.begin(), order.end(), [&](const Slot& x, const Slot& y) {
      return x.layer != y.layer ? x.layer < y.layer : rank(x) < rank(y);
    });
    p_->seed(static_cast<uint64_t>(seed));
    for (const Slot& s : order) {
      // mlx-lm's LoRALinear builds an nn.Linear first, whose weight draw (discarded) takes one
      // key from the sequence.
      (void)p_->next_key();
      const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.in)));
      p_->values[s.a] =
          mx::random::uniform(-scale, scale, {s.in, o_.rank}, mx::float32, p_->next_key());
      p_->values[s.b] = mx::zeros({o_.rank, s.out}, mx::float32);
      // DoRA: m = ||W|| per output row, of the float32 (dequantized) weight.
      if (s.m >= 0)
        p_->values[s.m] =
            mx::linalg::norm(mx::astype(base_weight(*s.base), mx::float32), std::vector<int>{1});
    }
    mx::eval(p_->values);
    mx::eval(p_->key);
  }

  const std::vector<Slot>& slots() const { return slots_; }

 private:
  int add(const std::string& name, const mx::Shape& shape) {
    p_->names.push_back(name);
    p_->values.push_back(mx::zeros(shape, mx::float32));
    return static_cast<int>(p_->values.size()) - 1;
  }

  // (layer, name in the layer) when linear_to_lora_layers converts the module at `path`.
  std::optional<std::pair<int, std::string>> selected(const std::string& path) const {
    if (path.rfind(prefix_, 0) != 0) return std::nullopt;
    const size_t p = prefix_.size();
    size_t q = p;
    while (q < path.size() && std::isdigit(static_cast<unsigned char>(path[q]))) ++q;
    if (q == p || q >= path.size() || path[q] != '.') return std::nullopt;
    const int layer = std::stoi(path.substr(p, q - p));
    const int first = o_.num_layers >= 0 ? layers_ - o_.num_layers : 0;
    if (layer < first) return std::nullopt;
    const std::string local = path.substr(q + 1);
    if (o_.keys && !contains(*o_.keys, local)) return std::nullopt;
    return std::make_pair(layer, local);
  }

  std::shared_ptr<ParamSet> p_;
  const TrainOptions& o_;
  std::string prefix_;
  int layers_ = 0;
  std::vector<Slot> slots_;
};

// load_model's steps with our adapter source, at tier L1 (no fused CPU kernels: they have no
// gradient).
std::unique_ptr<Model> load_trainable(const fs::path& dir, TrainSource& source,
                                      size_t* total_params) {
  const fs::path config_path = dir / "config.json";
  check(fs::exists(config_path), config_path.string(), "config.json not found");
  json config = read_json_file(config_path);
  const std::string where = config_path.string();
  check(config.is_object() && config.contains("model_type") && config["model_type"].is_string(),
        where, "missing required key 'model_type'");
  const std::string type = config["model_type"].get<std::string>();
  const Architecture* arch = find_architecture(type);
  check(arch != nullptr, where, "unsupported model_type '", type, "'");
  Weights weights = load_model_weights(dir);
  if (arch->sanitize) arch->sanitize(config, weights);
  source.bind(weights);
  const QuantConfig quant = QuantConfig::from_config(config, where);
  // get_total_parameters: a quantized weight counts its unpacked size; scales and biases not.
  size_t total = 0;
  for (const auto& [name, a] : weights) {
    if (name.ends_with(".scales") || name.ends_with(".biases")) continue;
    const std::string module = name.substr(0, name.rfind('.'));
    if (name.ends_with(".weight") && weights.count(module + ".scales")) {
      auto spec = quant.modules.count(module) ? quant.modules.at(module) : quant.defaults;
      total += a.size() * 32 / (spec ? spec->bits : 4);
    } else {
      total += a.size();
    }
  }
  *total_params = total;
  WeightStore store(std::move(weights), quant, dir.string());
  store.set_adapters(&source);
  std::unique_ptr<Model> model;
  try {
    model = arch->build(config, store);
  } catch (const json::exception& e) {
    fail(where, "invalid config: ", e.what());
  }
  store.check_all_used();
  return model;
}

// mlx-lm's training forward has no cache: K/V pass straight to attention, the mask is causal
// (windowed on sliding layers). Stateless, so a checkpointed layer can run again.
class NoCache : public KVCacheBase {
 public:
  std::pair<mx::array, mx::array> update_and_fetch(const mx::array& k,
                                                   const mx::array& v) override {
    return {k, v};
  }
  int offset() const override { return 0; }
  bool is_trimmable() const override { return false; }
  int trim(int, bool) override { return 0; }
  Mask make_mask(int n, std::optional<int> window, bool return_array) const override {
    return create_attention_mask(n, 0, return_array, window);
  }
  std::vector<mx::array> state() const override { return {}; }
  size_t nbytes() const override { return 0; }
};

// nn.losses.cross_entropy(logits, targets) (reduction none). On the GPU, as there, MLX's fused
// kernel: no (B, T, V) intermediates in the forward or the vjp (1.5 GB of Qwen3-0.6B's step at
// batch 4), float32 accumulation, the result in the logits' dtype. Elsewhere its composed form.
mx::array cross_entropy(const mx::array& logits, const mx::array& targets) {
  if (mx::default_device() == mx::Device::gpu && mx::issubdtype(logits.dtype(), mx::floating))
    return mx::astype(mx::fast::cross_entropy(logits, targets), logits.dtype());
  mx::array l = mx::subtract(logits, mx::stop_gradient(mx::max(logits, -1, true)));
  mx::array score = mx::squeeze(mx::take_along_axis(l, mx::expand_dims(targets, -1), -1), -1);
  return mx::subtract(mx::logsumexp(l, -1), score);
}

// trainer.default_loss: (mean cross-entropy over the unmasked targets, their count).
// `cache` must outlive the gradient computation when layers are checkpointed (a recompute reads
// it): the caller owns it.
std::vector<mx::array> default_loss(Model& model, const mx::array& batch, const mx::array& lengths,
                                    Cache& cache) {
  const int B = batch.shape(0), T = batch.shape(1) - 1;
  mx::array inputs = mx::slice(batch, {0, 0}, {B, T});
  mx::array targets = mx::slice(batch, {0, 1}, {B, T + 1});
  if (model.supports_layer_hook()) {
    cache.clear();
    for (int i = 0; i < model.num_layers(); ++i) cache.push_back(std::make_unique<NoCache>());
  } else {
    cache = model.make_cache();
  }
  mx::array logits = model(inputs, cache);
  mx::array steps = mx::arange(1, T + 1, mx::int32);
  mx::array mask = mx::logical_and(mx::greater_equal(steps, mx::slice(lengths, {0, 0}, {B, 1})),
                                   mx::less_equal(steps, mx::slice(lengths, {0, 1}, {B, 2})));
  mx::array ce = mx::multiply(cross_entropy(logits, targets), mask);
  mx::array ntoks = mx::sum(mask);
  ce = mx::divide(mx::sum(mx::astype(ce, mx::float32)), ntoks);
  return {ce, ntoks};
}

// A preference batch (2B rows: chosen, then rejected): per row, the summed float32
// log-probabilities of the answer's tokens (targets t with offset <= t + 1 < length) and their
// count.
std::pair<mx::array, mx::array> answer_logps(Model& model, const Batch& b, Cache& cache) {
  const int B = b.tokens.shape(0), T = b.tokens.shape(1) - 1;
  mx::array inputs = mx::slice(b.tokens, {0, 0}, {B, T});
  mx::array targets = mx::slice(b.tokens, {0, 1}, {B, T + 1});
  if (model.supports_layer_hook()) {
    cache.clear();
    for (int i = 0; i < model.num_layers(); ++i) cache.push_back(std::make_unique<NoCache>());
  } else {
    cache = model.make_cache();
  }
  mx::array logits = mx::astype(model(inputs, cache), mx::float32);
  mx::array logp = mx::negative(cross_entropy(logits, targets));
  mx::array steps = mx::arange(1, T + 1, mx::int32);
  mx::array mask =
      mx::astype(mx::logical_and(mx::greater_equal(steps, mx::slice(b.lengths, {0, 0}, {B, 1})),
                                 mx::less(steps, mx::slice(b.lengths, {0, 1}, {B, 2}))),
                 mx::float32);
  return {mx::sum(mx::multiply(logp, mask), -1), mx::sum(mask, -1)};
}

// log(1 - exp(x)) for log-probabilities x < 0, x capped at -1e-7 (a probability of 1 has no odds).
mx::array log1mexp(const mx::array& x) {
  mx::array y = mx::minimum(x, mx::array(-1e-7f));
  return mx::where(mx::greater(y, mx::array(static_cast<float>(-std::numbers::ln2))),
                   mx::log(mx::negative(mx::expm1(y))), mx::log1p(mx::negative(mx::exp(y))));
}

// -log(sigmoid(z)) = log(1 + exp(-z)).
mx::array neg_log_sigmoid(const mx::array& z) {
  return mx::logaddexp(mx::negative(z), mx::array(0.0f));
}

// {loss, answer tokens (int32), reward margin} of a preference batch from the policy's sums and
// counts (answer_logps) and, for DPO, the reference's sums.
//   DPO (Rafailov et al. 2023, sigmoid loss):
//     z = (pi_w - pi_l) - (ref_w - ref_l),  loss = mean(-log sigmoid(beta z)),
//     rewards beta (pi - ref), margin = mean chosen reward - mean rejected reward.
//   ORPO (Hong et al. 2024): p = per-token mean log-probability of an answer,
//     log odds ratio r = (p_w - p_l) - (log(1 - e^p_w) - log(1 - e^p_l)),
//     loss = mean(-p_w + lambda * -log sigmoid(r)),  rewards lambda p.
std::vector<mx::array> preference_loss(const TrainOptions& o, const mx::array& sums,
                                       const mx::array& counts,
                                       const std::optional<mx::array>& ref) {
  const int B = sums.shape(0) / 2;
  auto half = [B](const mx::array& a, int i) { return mx::slice(a, {i * B}, {(i + 1) * B}); };
  mx::array ntoks = mx::astype(mx::sum(counts), mx::int32);
  if (o.train_mode == "dpo") {
    const mx::array beta(static_cast<float>(o.beta));
    mx::array chosen = mx::subtract(half(sums, 0), half(*ref, 0));
    mx::array rejected = mx::subtract(half(sums, 1), half(*ref, 1));
    mx::array z = mx::subtract(mx::subtract(half(sums, 0), half(sums, 1)),
                               mx::subtract(half(*ref, 0), half(*ref, 1)));
    mx::array loss = mx::mean(neg_log_sigmoid(mx::multiply(beta, z)));
    mx::array margin =
        mx::subtract(mx::multiply(beta, mx::mean(chosen)), mx::multiply(beta, mx::mean(rejected)));
    return {loss, ntoks, mx::stop_gradient(margin)};
  }
  const mx::array lambda(static_cast<float>(o.lambda));
  mx::array avg = mx::divide(sums, mx::maximum(counts, mx::array(1.0f)));
  mx::array w = half(avg, 0), l = half(avg, 1);
  mx::array r = mx::subtract(mx::subtract(w, l), mx::subtract(log1mexp(w), log1mexp(l)));
  mx::array loss = mx::mean(mx::add(mx::negative(w), mx::multiply(lambda, neg_log_sigmoid(r))));
  mx::array margin =
      mx::subtract(mx::multiply(lambda, mx::mean(w)), mx::multiply(lambda, mx::mean(l)));
  return {loss, ntoks, mx::stop_gradient(margin)};
}

// The DPO reference's answer sums: the model with its adapters off (a full fine-tune: its loaded
// weights), evaluated before the policy's gradient.
mx::array reference_logps(Model& model, ParamSet& p, const Batch& b) {
  const std::vector<mx::array> saved = p.values;
  const bool training = p.training;
  p.training = false;
  if (!p.targets.empty()) p.set(p.initial);
  p.reference = true;
  Cache cache;
  mx::array sums = answer_logps(model, b, cache).first;
  mx::eval(sums);
  p.reference = false;
  p.training = training;
  if (!p.targets.empty()) p.set(saved);
  return sums;
}

// The loss of one batch for o.train_mode: {loss, tokens} (sft), plus the reward margin.
std::vector<mx::array> batch_loss(Model& model, ParamSet& p, const TrainOptions& o, const Batch& b,
                                  const std::optional<mx::array>& ref, Cache& cache) {
  if (o.train_mode == "sft") return default_loss(model, b.tokens, b.lengths, cache);
  auto [sums, counts] = answer_logps(model, b, cache);
  return preference_loss(o, sums, counts, ref);
}

// mlx.optimizers.schedulers evaluated at the optimizer's uint64 step (as arrays, for the same
// float32 rounding).
mx::array schedule_value(const Schedule& s, const mx::array& step) {
  auto arg = [&](size_t i, const char* what) {
    check(i < s.arguments.size(), "lr_schedule", s.name, " needs argument ", i + 1, " (", what,
          ")");
    return s.arguments[i];
  };
  auto f32 = [](double v) { return mx::array(static_cast<float>(v)); };
  auto u64 = [](double v) { return mx::array(static_cast<uint64_t>(v), mx::uint64); };
  auto linear = [&](double init, double end, double steps, const mx::array& t) {
    check(steps >= 1, "lr_schedule", "steps must be greater than 0, but got ", steps);
    mx::array k = mx::minimum(t, u64(steps));
    return mx::add(mx::multiply(k, f32((end - init) / steps)), f32(init));
  };
  auto main = [&](const mx::array& t) -> mx::array {
    if (s.name == "cosine_decay") {
      const double init = arg(0, "init"), decay_steps = arg(1, "decay_steps");
      const double end = s.arguments.size() > 2 ? s.arguments[2] : 0.0;
      check(decay_steps >= 1, "lr_schedule", "decay_steps must be greater than 0, but got ",
            decay_steps);
      mx::array k = mx::minimum(t, u64(decay_steps));
      mx::array decay = mx::multiply(
          f32(0.5),
          mx::add(f32(1.0), mx::cos(mx::multiply(f32(std::numbers::pi / decay_steps), k))));
      return mx::add(f32(end), mx::multiply(decay, f32(init - end)));
    }
    if (s.name == "linear_schedule")
      return linear(arg(0, "init"), arg(1, "end"), arg(2, "steps"), t);
    if (s.name == "exponential_decay")
      return mx::multiply(f32(arg(0, "init")), mx::power(f32(arg(1, "decay_rate")), t));
    if (s.name == "step_decay") {
      const double size = arg(2, "step_size");
      check(size >= 1, "lr_schedule", "step_size must be greater than 0, but got ", size);
      return mx::multiply(f32(arg(0, "init")),
                          mx::power(f32(arg(1, "decay_rate")), mx::floor_divide(t, u64(size))));
    }
    fail("lr_schedule", "unknown schedule '", s.name,
         "', expected cosine_decay, linear_schedule, exponential_decay or step_decay");
  };
  if (s.warmup <= 0) return main(step);
  // join_schedules([linear_schedule(warmup_init, init, warmup), main], [warmup + 1])
  const double boundary = s.warmup + 1;
  mx::array warm = linear(s.warmup_init, arg(0, "init"), s.warmup, step);
  return mx::where(mx::less(step, u64(boundary)), warm, main(mx::subtract(step, u64(boundary))));
}

// mlx.optimizers Adam / AdamW (bias correction off unless asked, as mlx's defaults).
class Optimizer {
 public:
  Optimizer(const TrainOptions& o, const std::vector<mx::array>& params) : o_(o) {
    check(o.optimizer == "adam" || o.optimizer == "adamw", "lmx lora", "unsupported optimizer '",
          o.optimizer, "', expected adam or adamw");
    const json cfg =
        o.optimizer_config.contains(o.optimizer) ? o.optimizer_config[o.optimizer] : json::object();
    const JsonView v{cfg, "optimizer_config." + o.optimizer};
    if (v.has("betas")) {
      auto b = v.get<std::vector<double>>("betas");
      check(b.size() == 2, v.source, "betas must have 2 values");
      b1_ = b[0];
      b2_ = b[1];
    }
    eps_ = v.get<double>("eps", 1e-8);
    bias_correction_ = v.get<bool>("bias_correction", false);
    weight_decay_ = o.optimizer == "adamw" ? v.get<double>("weight_decay", 0.01) : 0.0;
    for (const auto& p : params) {
      m_.push_back(mx::zeros_like(p));
      v_.push_back(mx::zeros_like(p));
    }
    lr_ = learning_rate_at(step_);
  }

  mx::array learning_rate_at(const mx::array& step) const {
    return o_.lr_schedule ? schedule_value(*o_.lr_schedule, step)
                          : mx::array(static_cast<float>(o_.learning_rate));
  }

  // apply_gradients: the scheduled rate at the current step, the step incremented, then each
  // parameter's update.
  void update(std::vector<mx::array>& params, const std::vector<mx::array>& grads) {
    lr_ = learning_rate_at(step_);
    step_ = mx::add(step_, mx::array(1, mx::uint64));
    auto f = [](double x) { return mx::array(static_cast<float>(x)); };
    for (size_t i = 0; i < params.size(); ++i) {
      const mx::array& g = grads[i];
      mx::array lr = mx::astype(lr_, g.dtype());
      mx::array p = params[i];
      if (weight_decay_ != 0.0)
        p = mx::multiply(p, mx::subtract(f(1.0), mx::multiply(lr, f(weight_decay_))));
      m_[i] = mx::add(mx::multiply(f(b1_), m_[i]), mx::multiply(f(1.0 - b1_), g));
      v_[i] = mx::add(mx::multiply(f(b2_), v_[i]), mx::multiply(f(1.0 - b2_), mx::square(g)));
      if (bias_correction_) {
        mx::array c1 =
            mx::astype(mx::divide(lr, mx::subtract(f(1.0), mx::power(f(b1_), step_))), g.dtype());
        mx::array c2 =
            mx::astype(mx::rsqrt(mx::subtract(f(1.0), mx::power(f(b2_), step_))), g.dtype());
        params[i] =
            mx::subtract(p, mx::divide(mx::multiply(c1, m_[i]),
                                       mx::add(mx::multiply(mx::sqrt(v_[i]), c2), f(eps_))));
      } else {
        params[i] =
            mx::subtract(p, mx::divide(mx::multiply(lr, m_[i]), mx::add(mx::sqrt(v_[i]), f(eps_))));
      }
    }
  }

  // {m..., v..., step, learning rate}: what a compiled step takes in and hands back.
  std::vector<mx::array> state() const {
    std::vector<mx::array> s = m_;
    s.insert(s.end(), v_.begin(), v_.end());
    s.push_back(step_);
    s.push_back(lr_);
    return s;
  }
  void set_state(std::vector<mx::array> s) {
    const size_t n = m_.size();
    check(s.size() == 2 * n + 2, "lmx lora", "optimizer state of ", s.size(), " arrays, expected ",
          2 * n + 2);
    std::move(s.begin(), s.begin() + n, m_.begin());
    std::move(s.begin() + n, s.begin() + 2 * n, v_.begin());
    step_ = std::move(s[2 * n]);
    lr_ = std::move(s[2 * n + 1]);
  }
  const mx::array& learning_rate() const { return lr_; }

 private:
  const TrainOptions& o_;
  double b1_ = 0.9, b2_ = 0.999, eps_ = 1e-8, weight_decay_ = 0.0;
  bool bias_correction_ = false;
  std::vector<mx::array> m_, v_;
  mx::array step_ = mx::array(0, mx::uint64);
  mx::array lr_ = mx::array(0.0f);
};

struct EvalResult {
  double loss = 0.0;
  std::optional<double> margin;  // dpo, orpo
};

// trainer.evaluate: the token-weighted mean loss over num_batches batches (-1: all). DPO and
// ORPO: the mean of the batches' losses and reward margins.
EvalResult evaluate(Model& model, ParamSet& p, const Dataset& data, const TrainOptions& o,
                    int num_batches, NumpyRandom& rng) {
  BatchIterator it(data, o.batch_size, o.max_seq_length, false, rng);
  const bool sft = o.train_mode == "sft";
  mx::array all_losses = mx::array(0.0f);
  mx::array ntokens = mx::array(0, mx::int32);
  mx::array margins = mx::array(0.0f);
  int batches = 0;
  for (int i = 0; num_batches == -1 || i < num_batches; ++i) {
    auto batch = it.next();
    if (!batch) break;
    ++batches;
    std::optional<mx::array> ref;
    if (o.train_mode == "dpo") ref = reference_logps(model, p, *batch);
    Cache cache;
    auto out = batch_loss(model, p, o, *batch, ref, cache);
    if (sft) {
      all_losses = mx::add(all_losses, mx::multiply(out[0], out[1]));
      ntokens = mx::add(ntokens, out[1]);
    } else {
      all_losses = mx::add(all_losses, out[0]);
      margins = mx::add(margins, out[2]);
    }
    mx::eval({all_losses, ntokens, margins});
  }
  if (sft) return {mx::divide(all_losses, ntokens).item<float>(), std::nullopt};
  check(batches > 0, data.source, "no batch to evaluate");
  const mx::array n(static_cast<float>(batches));
  return {mx::divide(all_losses, n).item<float>(), mx::divide(margins, n).item<float>()};
}

Weights adapter_weights(const ParamSet& p) {
  Weights w;
  for (size_t i = 0; i < p.names.size(); ++i) w.insert_or_assign(p.names[i], p.values[i]);
  return w;
}

void write_adapter_config(const TrainOptions& o) {
  fs::create_directories(o.adapter_path);
  json cfg = o.args;
  cfg.erase("_name_or_path");
  // train_model sets args.lora_parameters = None before save_config for a full fine-tune.
  if (o.fine_tune_type == "full") cfg["lora_parameters"] = nullptr;
  std::ofstream f(o.adapter_path / "adapter_config.json");
  check(f.good(), (o.adapter_path / "adapter_config.json").string(), "cannot write the file");
  f << cfg.dump(4) << "\n";
}

// --fine-tune-type full: every array of the last num_layers decoder layers trains (train_model
// unfreezes model.layers[-max(num_layers, 0):], so 0 and -1 mean all).
void bind_full(ParamSet& p, Model& model, const TrainOptions& o) {
  const int n = model.num_layers();
  const int first = o.num_layers > 0 ? n - o.num_layers : 0;
  for (int i = first; i < n; ++i) {
    auto* dense = dynamic_cast<nn::DenseDecoder*>(&model);
    check(dense != nullptr, "lmx lora",
          "--fine-tune-type full is not supported for this model_type yet, expected a llama-style "
          "decoder (llama, qwen2, qwen3, ...)");
    for (const auto& [name, a] : dense->layer_parameters(i)) {
      // mlx-lm unfreezes the packed weights too, then fails in the backward pass with
      // "[QuantizedMatmul::vjp] no gradient wrt the quantized weights".
      check(!name.ends_with(".scales"), o.model.string(),
            "--fine-tune-type full needs a float model, got a quantized layer (", name,
            "): quantized weights have no gradient; train lora or dora on it, or fine-tune a "
            "float copy (mlx_lm.convert --dequantize)");
      p.names.push_back(name);
      p.values.push_back(*a);
      p.initial.push_back(*a);
      p.targets.push_back(a);
    }
  }
}

void resume(ParamSet& p, const fs::path& file) {
  check(fs::exists(file), file.string(), "--resume-adapter-file does not exist");
  Weights w = load_safetensors(file);
  for (const auto& [name, a] : w) {
    auto it = std::find(p.names.begin(), p.names.end(), name);
    check(it != p.names.end(), file.string(), "tensor '", name,
          "' is not a trainable parameter of this run (check --num-layers and the keys)");
    const size_t i = it - p.names.begin();
    check(a.shape() == p.values[i].shape(), file.string(), "tensor '", name, "' has shape ",
          shape_str(a.shape()), ", expected ", shape_str(p.values[i].shape()));
    p.values[i] = a;
  }
  mx::eval(p.values);
  p.sync();
}

struct Clock {
  std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
};

void emit(const TrainOptions& o, std::ofstream* metrics, const MetricsCallback& cb, const json& j) {
  if (metrics) *metrics << j.dump() << "\n" << std::flush;
  if (cb) cb(j);
}

}  // namespace

json default_args() {
  return json{
      {"model", nullptr},
      {"train", false},
      {"fine_tune_type", "lora"},
      {"optimizer", "adam"},
      {"optimizer_config",
       {{"adam", json::object()},
        {"adamw", json::object()},
        {"muon", json::object()},
        {"sgd", json::object()},
        {"adafactor", json::object()}}},
      {"data", "data"},
      {"seed", 0},
      {"num_layers", 16},
      {"batch_size", 4},
      {"iters", 1000},
      {"val_batches", 25},
      {"learning_rate", 1e-5},
      {"steps_per_report", 10},
      {"steps_per_eval", 200},
      {"resume_adapter_file", nullptr},
      {"adapter_path", "adapters"},
      {"save_every", 100},
      {"test", false},
      {"test_batches", 500},
      {"max_seq_length", 2048},
      {"config", nullptr},
      {"grad_checkpoint", false},
      {"grad_accumulation_steps", 1},
      {"clear_cache_threshold", 0},
      {"lr_schedule", nullptr},
      {"lora_parameters", {{"rank", 8}, {"dropout", 0.0}, {"scale", 20.0}}},
      {"mask_prompt", false},
      {"report_to", nullptr},
      {"project_name", nullptr},
      {"trust_remote_code", false},
  };
}

TrainOptions TrainOptions::from_args(const json& args) {
  const JsonView v{args, "lmx lora"};
  TrainOptions o;
  o.args = args;
  check(v.has("model"), v.source, "missing --model");
  o.model = v.get<std::string>("model");
  o.data = v.get<std::string>("data", "data");
  o.train = v.get<bool>("train", false);
  o.test = v.get<bool>("test", false);
  o.fine_tune_type = v.get<std::string>("fine_tune_type", "lora");
  o.train_mode = v.get<std::string>("train_mode", "sft");
  check(o.train_mode == "sft" || o.train_mode == "dpo" || o.train_mode == "orpo", v.source,
        "unknown train_mode '", o.train_mode, "', expected sft, dpo or orpo");
  o.beta = v.get<double>("beta", 0.1);
  o.lambda = v.get<double>("lambda", 0.1);
  check(o.beta > 0, v.source, "beta must be positive, got ", o.beta);
  check(o.lambda >= 0, v.source, "lambda must not be negative, got ", o.lambda);
  check(o.fine_tune_type == "lora" || o.fine_tune_type == "dora" || o.fine_tune_type == "full",
        v.source, "Received unknown fine-tune-type ", o.fine_tune_type,
        ", expected lora, dora or full");
  o.optimizer = v.get<std::string>("optimizer", "adam");
  for (auto& c : o.optimizer) c = static_cast<char>(std::tolower(c));
  if (v.has("optimizer_config")) o.optimizer_config = args["optimizer_config"];
  o.seed = v.get<int>("seed", 0);
  o.num_layers = v.get<int>("num_layers", 16);
  o.batch_size = v.get<int>("batch_size", 4);
  o.iters = v.get<int>("iters", 1000);
  o.val_batches = v.get<int>("val_batches", 25);
  o.learning_rate = v.get<double>("learning_rate", 1e-5);
  o.steps_per_report = v.get<int>("steps_per_report", 10);
  o.steps_per_eval = v.get<int>("steps_per_eval", 200);
  if (v.has("resume_adapter_file"))
    o.resume_adapter_file = v.get<std::string>("resume_adapter_file");
  o.adapter_path = v.get<std::string>("adapter_path", "adapters");
  o.save_every = v.get<int>("save_every", 100);
  o.test_batches = v.get<int>("test_batches", 500);
  o.max_seq_length = v.get<int>("max_seq_length", 2048);
  o.grad_accumulation_steps = v.get<int>("grad_accumulation_steps", 1);
  o.grad_checkpoint = v.get<bool>("grad_checkpoint", false);
  check(o.batch_size >= 1, v.source, "batch_size must be at least 1, got ", o.batch_size);
  check(o.grad_accumulation_steps >= 1, v.source, "grad_accumulation_steps must be at least 1");
  check(o.steps_per_report >= 1 && o.steps_per_eval >= 1 && o.save_every >= 1, v.source,
        "steps_per_report, steps_per_eval and save_every must be at least 1");
  check(o.max_seq_length >= 2, v.source, "max_seq_length must be at least 2");
  if (v.has("lr_schedule")) {
    const JsonView s{args["lr_schedule"], "lr_schedule"};
    Schedule sc;
    sc.name = s.get<std::string>("name");
    sc.arguments = s.get<std::vector<double>>("arguments");
    check(!sc.arguments.empty(), s.source, "arguments must not be empty");
    sc.warmup = s.get<int>("warmup", 0);
    sc.warmup_init = s.get<double>("warmup_init", 0.0);
    o.lr_schedule = sc;
  }
  const json lp = v.has("lora_parameters")     ? args["lora_parameters"]
                  : o.fine_tune_type == "full" ? json{{"scale", 20.0}}
                                               : json::object();
  const JsonView l{lp, "lora_parameters"};
  check(l.has("scale"), l.source, "missing required key 'scale'",
        lp.contains("alpha") ? " (found 'alpha': mlx-lm's LoRA config uses 'scale')" : "");
  o.rank = l.get<int>("rank", 8);
  o.scale = static_cast<float>(l.get<double>("scale"));
  o.dropout = l.get<double>("dropout", 0.0);
  check(o.rank >= 1, l.source, "rank must be at least 1, got ", o.rank);
  check(o.dropout >= 0.0 && o.dropout < 1.0, l.source, "dropout must be in [0, 1)");
  if (l.has("keys")) o.keys = l.get<std::vector<std::string>>("keys");
  o.data_options.mask_prompt = v.get<bool>("mask_prompt", false);
  o.data_options.preference = o.train_mode != "sft";
  o.data_options.text_feature = v.get<std::string>("text_feature", "text");
  o.data_options.prompt_feature = v.get<std::string>("prompt_feature", "prompt");
  o.data_options.completion_feature = v.get<std::string>("completion_feature", "completion");
  o.data_options.chat_feature = v.get<std::string>("chat_feature", "messages");
  if (v.has("metrics_file")) o.metrics_file = v.get<std::string>("metrics_file");
  check(o.train || o.test, v.source, "Must provide at least one of --train or --test");
  check(o.train || o.train_mode != "dpo", v.source,
        "--test with --train-mode dpo needs --train (the reference is the model without the "
        "adapter, which a test-only run does not keep)");
  return o;
}

void run(const TrainOptions& o, const MetricsCallback& on_metrics) {
  NumpyRandom rng(static_cast<uint32_t>(o.seed));
  std::unique_ptr<std::ofstream> metrics;
  if (o.metrics_file) {
    if (o.metrics_file->has_parent_path()) fs::create_directories(o.metrics_file->parent_path());
    metrics = std::make_unique<std::ofstream>(*o.metrics_file);
    check(metrics->good(), o.metrics_file->string(), "cannot write the metrics file");
  }
  std::printf("Loading pretrained model\n");
  std::fflush(stdout);
  const Tokenizer tokenizer = Tokenizer::from_dir(o.model);
  std::optional<chat::ChatTemplate> tmpl;
  TextCodec codec{&tokenizer, [&]() -> const chat::ChatTemplate& {
                    if (!tmpl) tmpl = chat::ChatTemplate::from_model_dir(o.model);
                    return *tmpl;
                  }};
  std::printf("Loading datasets\n");
  std::fflush(stdout);
  const Dataset train_set = load_jsonl(o.data / "train.jsonl", codec, o.data_options);
  const Dataset valid_set = load_jsonl(o.data / "valid.jsonl", codec, o.data_options);
  const Dataset test_set =
      o.test ? load_jsonl(o.data / "test.jsonl", codec, o.data_options) : Dataset{};
  check(!o.train || train_set.size() > 0, (o.data / "train.jsonl").string(),
        "Training set not found or empty. Must provide training set for fine-tuning.");
  if (o.train && valid_set.size() == 0)
    std::printf(
        "Warning: Validation set not found or empty. Training will proceed without "
        "validation.\n");
  check(!o.test || test_set.size() > 0, (o.data / "test.jsonl").string(),
        "Test set not found or empty. Must provide test set for evaluation.");

  auto params = std::make_shared<ParamSet>();
  params->dropout = o.dropout;
  std::unique_ptr<Model> model;
  if (o.train) {
    TrainSource source(params, o);
    size_t total = 0;
    model = load_trainable(o.model, source, &total);
    if (o.fine_tune_type == "full") {
      params->seed(static_cast<uint64_t>(o.seed));
      bind_full(*params, *model, o);
    } else {
      check(!source.slots().empty(), "lmx lora",
            "no layer matched the LoRA keys, expected module names such as self_attn.q_proj");
      source.initialize(o.seed);
    }
    if (o.resume_adapter_file) {
      std::printf("Loading fine-tuned weights from %s\n", o.resume_adapter_file->c_str());
      resume(*params, *o.resume_adapter_file);
    }
    size_t trainable = 0;
    for (const auto& a : params->values) trainable += a.size();
    std::printf("Trainable parameters: %.3f%% (%.3fM/%.3fM)\n",
                100.0 * trainable / static_cast<double>(total), trainable / 1e6, total / 1e6);
    write_adapter_config(o);
    const fs::path adapter_file = o.adapter_path / "adapters.safetensors";
    Optimizer opt(o, params->values);
    std::vector<int> argnums(params->values.size());
    std::iota(argnums.begin(), argnums.end(), 0);
    const Batch* current = nullptr;
    std::optional<mx::array> current_ref;
    Cache step_cache;
    auto loss_and_grad = mx::value_and_grad(
        [&](const std::vector<mx::array>& ps) {
          params->set(ps);
          return batch_loss(*model, *params, o, *current, current_ref, step_cache);
        },
        argnums);
    if (o.grad_checkpoint) {
      check(model->supports_layer_hook(), "lmx lora",
            "--grad-checkpoint is not supported for this model_type yet, expected a llama-style "
            "decoder (llama, qwen2, qwen3, ...)");
      // trainer.grad_checkpoint: each layer under mx.checkpoint with the layer's own trainable
      // parameters as inputs (mlx-lm passes the layer module's trainable_parameters()),
      // recomputed in the backward pass instead of keeping its activations. Passing every
      // parameter to every layer made each layer's vjp produce (zero) gradients for all of them:
      // 5x slower on a GPU.
      auto by_layer = std::make_shared<std::map<int, std::vector<size_t>>>();
      for (size_t i = 0; i < params->names.size(); ++i)
        if (auto layer = layer_of(params->names[i])) (*by_layer)[*layer].push_back(i);
      model->set_layer_hook(
          [params, by_layer](int layer, const mx::array& x, const Model::LayerFn& f) {
            const auto found = by_layer->find(layer);
            const std::vector<size_t> none;
            const std::vector<size_t>& idx = found == by_layer->end() ? none : found->second;
            std::vector<mx::array> in;
            for (size_t i : idx) in.push_back(params->values[i]);
            in.push_back(x);
            auto run = mx::checkpoint([params, f, idx](const std::vector<mx::array>& in) {
              const std::vector<mx::array> saved = params->values;
              std::vector<mx::array> inside = saved;
              for (size_t k = 0; k < idx.size(); ++k) inside[idx[k]] = in[k];
              params->set(std::move(inside));
              std::vector<mx::array> out{f(in.back())};
              params->set(saved);
              return out;
            });
            return run(in)[0];
          });
    }

    // mlx-lm's `step` (tuner/trainer.py), which it compiles with the model's, the optimizer's
    // and mx.random's state as implicit inputs and outputs: the loss and gradients of a batch,
    // the accumulated gradients added, and on an update step their mean through the optimizer.
    // MLX's C++ compile has no implicit state, so the state is passed explicitly:
    //   in:  tokens, lengths, [DPO reference sums], key, parameters (n), optimizer state
    //        (m, v: n each; step; learning rate), [accumulated gradients (n)]
    //   out: loss, tokens, [reward margin], key, parameters, optimizer state,
    //        [gradients (n), when not updating]
    // One compiled function per (accumulated, update) pair, as mx.compile traces one per value
    // of its non-array arguments; each traces again for a new batch shape. MLX_DISABLE_COMPILE
    // (honoured by MLX) runs the same function uncompiled.
    const bool dpo = o.train_mode == "dpo";
    const size_t n_params = params->values.size();
    auto make_step = [&](bool accumulated, bool update) {
      return [&, accumulated, update](const std::vector<mx::array>& in) {
        auto at = in.begin();
        Batch b{at[0], at[1]};
        at += 2;
        current = &b;
        current_ref.reset();
        if (dpo) current_ref = *at++;
        params->key = *at++;
        const std::vector<mx::array> saved(at, at + n_params);
        at += n_params;
        opt.set_state(std::vector<mx::array>(at, at + 2 * n_params + 2));
        at += 2 * n_params + 2;
        auto [values, grads] = loss_and_grad(saved);
        params->set(saved);
        if (accumulated)
          for (size_t i = 0; i < n_params; ++i) grads[i] = mx::add(grads[i], at[i]);
        if (update) {
          if (o.grad_accumulation_steps > 1)
            for (auto& g : grads)
              g = mx::divide(g, mx::array(static_cast<float>(o.grad_accumulation_steps)));
          opt.update(params->values, grads);
          params->sync();
        }
        std::vector<mx::array> out = values;
        out.push_back(params->key);
        out.insert(out.end(), params->values.begin(), params->values.end());
        for (auto& a : opt.state()) out.push_back(std::move(a));
        if (!update) out.insert(out.end(), grads.begin(), grads.end());
        current = nullptr;
        return out;
      };
    };
    using StepFn = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;
    std::map<std::pair<bool, bool>, StepFn> steps_by_kind;
    auto step_fn = [&](bool accumulated, bool update) -> const StepFn& {
      auto& f = steps_by_kind[{accumulated, update}];
      if (!f) f = mx::compile(StepFn(make_step(accumulated, update)));
      return f;
    };

    std::printf("Starting training..., iters: %d\n", o.iters);
    std::fflush(stdout);
    BatchIterator train_it(train_set, o.batch_size, o.max_seq_length, true, rng);
    const bool sft = o.train_mode == "sft";
    std::optional<mx::array> losses, n_tokens, margins;
    std::optional<std::vector<mx::array>> accum;
    int steps = 0;
    long long trained_tokens = 0;
    double train_time = 0;
    for (int it = 1; it <= o.iters; ++it) {
      Batch batch = *train_it.next();
      Clock tic;
      if (valid_set.size() > 0 && (it == 1 || it % o.steps_per_eval == 0 || it == o.iters)) {
        params->training = false;
        Clock vt;
        const EvalResult val = evaluate(*model, *params, valid_set, o, o.val_batches, rng);
        const double val_time = vt.seconds();
        json report = {{"iteration", it - 1}, {"val_loss", val.loss}, {"val_time", val_time}};
        if (val.margin) {
          std::printf("Iter %d: Val loss %.3f, Val reward margin %.3f, Val took %.3fs\n", it,
                      val.loss, *val.margin, val_time);
          report["reward_margin"] = *val.margin;
        } else {
          std::printf("Iter %d: Val loss %.3f, Val took %.3fs\n", it, val.loss, val_time);
        }
        std::fflush(stdout);
        emit(o, metrics.get(), on_metrics, report);
        tic = Clock{};
      }
      params->training = true;
      std::vector<mx::array> in{batch.tokens, batch.lengths};
      if (dpo) in.push_back(reference_logps(*model, *params, batch));
      in.push_back(params->key);
      in.insert(in.end(), params->values.begin(), params->values.end());
      for (auto& a : opt.state()) in.push_back(std::move(a));
      if (accum) in.insert(in.end(), accum->begin(), accum->end());
      const bool update = it % o.grad_accumulation_steps == 0;
      std::vector<mx::array> out = step_fn(accum.has_value(), update)(in);
      const size_t n_values = sft ? 2 : 3;
      std::vector<mx::array> values(out.begin(), out.begin() + n_values);
      auto at = out.begin() + n_values;
      params->key = *at++;
      params->set(std::vector<mx::array>(at, at + n_params));
      at += n_params;
      opt.set_state(std::vector<mx::array>(at, at + 2 * n_params + 2));
      at += 2 * n_params + 2;
      if (update)
        accum.reset();
      else
        accum = std::vector<mx::array>(at, at + n_params);
      losses = losses ? mx::add(*losses, values[0]) : values[0];
      n_tokens = n_tokens ? mx::add(*n_tokens, values[1]) : values[1];
      if (!sft) margins = margins ? mx::add(*margins, values[2]) : values[2];
      ++steps;
      std::vector<mx::array> to_eval = params->values;
      for (const auto& s : opt.state()) to_eval.push_back(s);
      to_eval.push_back(params->key);
      to_eval.push_back(*losses);
      to_eval.push_back(*n_tokens);
      if (margins) to_eval.push_back(*margins);
      if (accum) to_eval.insert(to_eval.end(), accum->begin(), accum->end());
      mx::eval(to_eval);
      train_time += tic.seconds();

      if (it % o.steps_per_report == 0 || it == o.iters) {
        // mlx-lm: losses.item() / steps, a Python float (double) division.
        const double train_loss = static_cast<double>(losses->item<float>()) / steps;
        const long long ntok = n_tokens->item<int32_t>();
        const double lr = opt.learning_rate().item<float>();
        const double it_sec = o.steps_per_report / train_time;
        const double tok_sec = ntok / train_time;
        trained_tokens += ntok;
        const double peak = mx::get_peak_memory() / 1e9;
        std::string margin_text;
        json report = {{"iteration", it},
                       {"train_loss", train_loss},
                       {"learning_rate", lr},
                       {"iterations_per_second", it_sec},
                       {"tokens_per_second", tok_sec},
                       {"trained_tokens", trained_tokens},
                       {"peak_memory", peak}};
        if (margins) {
          const double margin = static_cast<double>(margins->item<float>()) / steps;
          report["reward_margin"] = margin;
          char buf[64];
          std::snprintf(buf, sizeof(buf), ", Reward margin %.3f", margin);
          margin_text = buf;
        }
        std::printf(
            "Iter %d: Train loss %.3f%s, Learning Rate %.3e, It/sec %.3f, Tokens/sec %.3f, "
            "Trained Tokens %lld, Peak mem %.3f GB\n",
            it, train_loss, margin_text.c_str(), lr, it_sec, tok_sec, trained_tokens, peak);
        std::fflush(stdout);
        emit(o, metrics.get(), on_metrics, report);
        losses.reset();
        margins.reset();
        n_tokens.reset();
        steps = 0;
        train_time = 0;
      }
      if (it % o.save_every == 0) {
        const Weights w = adapter_weights(*params);
        save_safetensors(adapter_file, w);
        char name[64];
        std::snprintf(name, sizeof(name), "%07d_adapters.safetensors", it);
        save_safetensors(o.adapter_path / name, w);
        std::printf("Iter %d: Saved adapter weights to %s and %s.\n", it, adapter_file.c_str(),
                    (o.adapter_path / name).c_str());
      }
    }
    save_safetensors(adapter_file, adapter_weights(*params));
    std::printf("Saved final weights to %s.\n", adapter_file.c_str());
    std::fflush(stdout);
  } else {
    LoadOptions lo{.exact = true};
    if (!o.adapter_path.empty()) lo.adapter_path = o.adapter_path;
    model = std::move(load_model(o.model, lo).model);
  }
  if (o.test) {
    params->training = false;
    std::printf("Testing\n");
    const EvalResult test = evaluate(*model, *params, test_set, o, o.test_batches, rng);
    if (test.margin) {
      std::printf("Test loss %.3f, Test reward margin %.3f.\n", test.loss, *test.margin);
      emit(o, metrics.get(), on_metrics,
           {{"test_loss", test.loss}, {"reward_margin", *test.margin}});
    } else {
      const double ppl = std::exp(test.loss);
      std::printf("Test loss %.3f, Test ppl %.3f.\n", test.loss, ppl);
      emit(o, metrics.get(), on_metrics, {{"test_loss", test.loss}, {"test_ppl", ppl}});
    }
    std::fflush(stdout);
  }
}

}  // namespace lmx::train
