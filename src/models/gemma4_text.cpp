// Gemma 4 text: mlx_lm/models/gemma4_text.py. Sliding / full layers from layer_types (default:
// every sliding_window_pattern-th is full), each with its own RoPE from rope_parameters (full:
// "proportional", rotating the leading partial_rotary_factor of a wider global_head_dim).
// Standard RMSNorms (q and k with weights, v without), attention scale 1, values not rotated.
// The last num_kv_shared_layers layers own no K/V: they attend to the cached K/V of the last
// earlier layer of their type (only donor layers have caches). Optional per-layer input
// embeddings (E2B/E4B), a layer scalar, double-wide MLPs on shared layers, a MoE block (router
// + top-k experts through SwitchGLU, in parallel with the dense MLP) and a final logit softcap.
#include "models/gemma4_text.h"

#include <cmath>
#include <map>

#include "cache/rotating_kv_cache.h"
#include "nn/switch_layers.h"
#include "nn/transformer.h"

namespace lmx {
namespace {

struct Args {
  int hidden_size, num_hidden_layers, intermediate_size, num_attention_heads, head_dim;
  int global_head_dim;  // 0: head_dim
  float rms_norm_eps;
  int vocab_size, vocab_size_per_layer_input, num_key_value_heads;
  std::optional<int> num_global_key_value_heads;
  int num_kv_shared_layers, hidden_size_per_layer_input;  // 0: no per-layer inputs
  bool rope_traditional;
  json rope_parameters;
  int sliding_window, sliding_window_pattern, max_position_embeddings;
  bool attention_k_eq_v;
  std::optional<double> final_logit_softcapping;
  bool use_double_wide_mlp, enable_moe_block;
  int num_experts = 0, top_k_experts = 0, moe_intermediate_size = 0;
  std::vector<std::string> layer_types;
  bool tie_word_embeddings;

  int first_kv_shared() const { return num_hidden_layers - num_kv_shared_layers; }
  bool is_sliding(int i) const { return layer_types[i] == "sliding_attention"; }
};

// gemma4_text.ModelArgs with its defaults (and __post_init__).
Args parse_args(const json& c, const std::string& source) {
  JsonView v{c, source};
  // An explicit null is Python's None (falsy), a missing key the dataclass default.
  auto nullable = [&](const char* key, int fallback) {
    if (!c.contains(key)) return fallback;
    return c[key].is_null() ? 0 : v.get<int>(key);
  };
  Args a;
  a.hidden_size = v.get<int>("hidden_size", 1536);
  a.num_hidden_layers = v.get<int>("num_hidden_layers", 35);
  a.intermediate_size = v.get<int>("intermediate_size", 6144);
  a.num_attention_heads = v.get<int>("num_attention_heads", 8);
  a.head_dim = v.get<int>("head_dim", 256);
  a.global_head_dim = nullable("global_head_dim", 512);
  a.rms_norm_eps = v.get<float>("rms_norm_eps", 1e-6f);
  a.vocab_size = v.get<int>("vocab_size", 262144);
  a.vocab_size_per_layer_input = v.get<int>("vocab_size_per_layer_input", 262144);
  a.num_key_value_heads = v.get<int>("num_key_value_heads", 1);
  a.num_global_key_value_heads = v.get_opt<int>("num_global_key_value_heads");
  a.num_kv_shared_layers = v.get<int>("num_kv_shared_layers", 20);
  a.hidden_size_per_layer_input = nullable("hidden_size_per_layer_input", 256);
  a.rope_traditional = v.get<bool>("rope_traditional", false);
  a.sliding_window = v.get<int>("sliding_window", 512);
  a.sliding_window_pattern = v.get<int>("sliding_window_pattern", 5);
  a.max_position_embeddings = v.get<int>("max_position_embeddings", 131072);
  a.attention_k_eq_v = v.get<bool>("attention_k_eq_v", false);
  a.final_logit_softcapping = 30.0;
  if (c.contains("final_logit_softcapping"))
    a.final_logit_softcapping = v.get_opt<double>("final_logit_softcapping");
  a.use_double_wide_mlp = v.get<bool>("use_double_wide_mlp", true);
  a.enable_moe_block = v.get<bool>("enable_moe_block", false);
  a.tie_word_embeddings = v.get<bool>("tie_word_embeddings", true);
  if (a.enable_moe_block) {
    a.num_experts = v.get<int>("num_experts");
    a.top_k_experts = v.get<int>("top_k_experts");
    a.moe_intermediate_size = v.get<int>("moe_intermediate_size");
    check(a.top_k_experts > 0 && a.top_k_experts <= a.num_experts, source, "top_k_experts ",
          a.top_k_experts, " must be in [1, num_experts = ", a.num_experts, "]");
  }
  a.rope_parameters = v.has("rope_parameters") ? c["rope_parameters"]
                                               : json{{"full_attention",
                                                       {{"partial_rotary_factor", 0.25},
                                                        {"rope_theta", 1e6},
                                                        {"rope_type", "proportional"}}},
                                                      {"sliding_attention",
                                                       {{"partial_rotary_factor", 1.0},
                                                        {"rope_theta", 10000.0},
                                                        {"rope_type", "default"}}}};
  check(a.rope_parameters.is_object(), source, "rope_parameters must be an object");
  if (v.has("layer_types")) {
    a.layer_types = v.get<std::vector<std::string>>("layer_types");
  } else {
    check(a.sliding_window_pattern > 0, source, "sliding_window_pattern must be > 0, got ",
          a.sliding_window_pattern);
    for (int i = 0; i < a.num_hidden_layers; ++i)
      a.layer_types.emplace_back(i % a.sliding_window_pattern == a.sliding_window_pattern - 1
                                     ? "full_attention"
                                     : "sliding_attention");
  }
  check(static_cast<int>(a.layer_types.size()) >= a.num_hidden_layers, source, "layer_types has ",
        a.layer_types.size(), " entries, expected num_hidden_layers = ", a.num_hidden_layers);
  for (const auto& t : a.layer_types)
    check(t == "full_attention" || t == "sliding_attention", source, "layer_types entry '", t,
          "', expected full_attention or sliding_attention");
  check(a.num_kv_shared_layers >= 0 && a.num_kv_shared_layers <= a.num_hidden_layers, source,
        "num_kv_shared_layers ", a.num_kv_shared_layers, " must be in [0, num_hidden_layers]");
  return a;
}

// mx.fast.rope with the offset as an array (mlx-lm passes mx.array(cache.offset) here).
mx::array rope_at(const nn::RoPE& r, const mx::array& x, const mx::array& offset) {
  return mx::fast::rope(x, r.dims, r.traditional, r.base, r.scale, offset, r.freqs);
}

// geglu (compiled, shapeless): gelu_approx(gate) * x.
mx::array geglu(const mx::array& gate, const mx::array& x) {
  static auto fn = mx::compile(
      [](const std::vector<mx::array>& in) {
        return std::vector<mx::array>{mx::multiply(nn::gelu_approx(in[0]), in[1])};
      },
      /*shapeless=*/true);
  return fn({gate, x})[0];
}

mx::array last_axis(const mx::array& x, int start, int stop) {
  mx::Shape lo(x.ndim(), 0), hi = x.shape();
  lo.back() = start;
  hi.back() = stop;
  return mx::slice(x, lo, hi);
}

// What a donor layer hands to the layers sharing its K/V: the keys/values its cache returned
// (plain, or quantized with the cache's settings) and its RoPE offset.
struct SharedKV {
  std::optional<std::pair<mx::array, mx::array>> plain;
  std::optional<std::pair<QuantizedArray, QuantizedArray>> quantized;
  KVQuantization quant;
  mx::array offset{0};
};

struct Attention {
  bool has_kv, use_k_eq_v;
  int n_heads, n_kv_heads, head_dim;
  float eps;
  nn::Linear q_proj, o_proj;
  std::optional<nn::Linear> k_proj, v_proj;
  nn::RMSNorm q_norm;
  std::optional<nn::RMSNorm> k_norm;
  nn::RoPE rope;

  Attention(const Args& a, int i, WeightStore& w, const std::string& p, const std::string& source)
      : has_kv(i < a.first_kv_shared()),
        use_k_eq_v(a.attention_k_eq_v && !a.is_sliding(i)),
        n_heads(a.num_attention_heads),
        n_kv_heads(use_k_eq_v && a.num_global_key_value_heads ? *a.num_global_key_value_heads
                                                              : a.num_key_value_heads),
        head_dim(!a.is_sliding(i) && a.global_head_dim ? a.global_head_dim : a.head_dim),
        eps(a.rms_norm_eps),
        q_proj(nn::Linear::load(w, p + ".q_proj", a.hidden_size, n_heads * head_dim, false)),
        o_proj(nn::Linear::load(w, p + ".o_proj", n_heads * head_dim, a.hidden_size, false)),
        q_norm(nn::RMSNorm::load(w, p + ".q_norm", head_dim, eps)) {
    if (has_kv) {
      k_proj = nn::Linear::load(w, p + ".k_proj", a.hidden_size, n_kv_heads * head_dim, false);
      if (!use_k_eq_v)
        v_proj = nn::Linear::load(w, p + ".v_proj", a.hidden_size, n_kv_heads * head_dim, false);
      k_norm = nn::RMSNorm::load(w, p + ".k_norm", head_dim, eps);
    }
    const std::string key = a.is_sliding(i) ? "sliding_attention" : "full_attention";
    const json params = a.rope_parameters.contains(key) ? a.rope_parameters[key] : json::object();
    const float theta = params.contains("rope_theta") ? params["rope_theta"].get<float>() : 1e4f;
    rope = nn::make_rope(head_dim, theta, a.rope_traditional, params, a.max_position_embeddings,
                         source);
    check(!rope.dynamic && rope.mscale == 1.0f, source, "rope_parameters.", key,
          ": only default, linear, proportional, llama3 RoPE are supported for gemma4");
  }

  // cache: the layer's own cache (donors), nullptr for KV-shared layers, which get `shared`.
  std::pair<mx::array, SharedKV> operator()(const mx::array& x, const Mask& mask,
                                            KVCacheBase* cache, const SharedKV* shared) const {
    const int B = x.shape(0), L = x.shape(1);
    mx::array q = q_norm(mx::reshape(q_proj(x), {B, L, n_heads, head_dim}));
    SharedKV kv;
    std::optional<mx::array> k, v;
    if (shared) {
      kv = *shared;
    } else {
      check(has_kv && cache, "gemma4", "a KV-shared layer got no shared K/V");
      k = mx::reshape((*k_proj)(x), {B, L, n_kv_heads, head_dim});
      v = use_k_eq_v ? *k : mx::reshape((*v_proj)(x), {B, L, n_kv_heads, head_dim});
      kv.offset = mx::array(cache->offset());
      k = rope_at(rope, mx::transpose((*k_norm)(*k), {0, 2, 1, 3}), kv.offset);
      v = mx::transpose(mx::fast::rms_norm(*v, std::nullopt, eps), {0, 2, 1, 3});
    }
    q = rope_at(rope, mx::transpose(q, {0, 2, 1, 3}), kv.offset);
    if (cache) {
      if (auto quant = cache->quantization()) {
        kv.quantized = cache->update_and_fetch_quantized(*k, *v);
        kv.quant = *quant;
      } else {
        kv.plain = cache->update_and_fetch(*k, *v);
      }
    }
    // Sharers of a quantized donor take the quantized path too (mlx-lm has no path for them).
    mx::array out = kv.quantized
                        ? nn::quantized_attention(q, kv.quantized->first, kv.quantized->second,
                                                  1.0f, mask, kv.quant)
                        : nn::attention(q, kv.plain->first, kv.plain->second, 1.0f, mask);
    return {o_proj(nn::merge_heads(out)), kv};
  }
};

struct MLP {
  nn::Linear gate_proj, up_proj, down_proj;
  mx::array operator()(const mx::array& x) const {
    return down_proj(geglu(gate_proj(x), up_proj(x)));
  }
};

MLP load_mlp(WeightStore& w, const std::string& p, int dims, int hidden) {
  return {nn::Linear::load(w, p + ".gate_proj", dims, hidden, false),
          nn::Linear::load(w, p + ".up_proj", dims, hidden, false),
          nn::Linear::load(w, p + ".down_proj", hidden, dims, false)};
}

// Router: rms_norm with scale * hidden^-0.5, project, top-k, softmax (not precise) over the
// chosen scores, times per_expert_scale.
struct Router {
  nn::Linear proj;
  mx::array scale, per_expert_scale;
  float eps;
  int top_k;
  double root_size;

  std::pair<mx::array, mx::array> operator()(const mx::array& x) const {
    mx::array w = mx::multiply(scale, mx::array(static_cast<float>(root_size), scale.dtype()));
    mx::array scores = proj(mx::fast::rms_norm(x, w, eps));
    const int E = scores.shape(-1);
    mx::array idx = last_axis(mx::argpartition(scores, -top_k, -1), E - top_k, E);
    mx::array weights = mx::softmax(mx::take_along_axis(scores, idx, -1), -1, /*precise=*/false);
    return {idx, mx::multiply(weights, mx::take(per_expert_scale, idx, 0))};
  }
};

struct MoE {
  Router router;
  nn::SwitchGLU experts;
  nn::RMSNorm post_feedforward_layernorm_1, post_feedforward_layernorm_2,
      pre_feedforward_layernorm_2;
};

struct PerLayerInput {
  nn::Linear per_layer_input_gate, per_layer_projection;
  nn::RMSNorm post_per_layer_input_norm;
};

struct DecoderLayer {
  Attention self_attn;
  MLP mlp;
  nn::RMSNorm input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
      post_feedforward_layernorm;
  std::optional<MoE> moe;
  std::optional<PerLayerInput> per_layer;
  mx::array layer_scalar;

  DecoderLayer(const Args& a, int i, WeightStore& w, const std::string& p,
               const std::string& source)
      : self_attn(a, i, w, p + ".self_attn", source),
        mlp(load_mlp(w, p + ".mlp", a.hidden_size,
                     a.intermediate_size * (a.use_double_wide_mlp && i >= a.first_kv_shared() &&
                                                    a.first_kv_shared() > 0
                                                ? 2
                                                : 1))),
        input_layernorm(norm(w, p + ".input_layernorm", a)),
        post_attention_layernorm(norm(w, p + ".post_attention_layernorm", a)),
        pre_feedforward_layernorm(norm(w, p + ".pre_feedforward_layernorm", a)),
        post_feedforward_layernorm(norm(w, p + ".post_feedforward_layernorm", a)),
        layer_scalar(w.take(p + ".layer_scalar", {1})) {
    const int H = a.hidden_size;
    if (a.enable_moe_block) {
      Router router{nn::Linear::load(w, p + ".router.proj", H, a.num_experts, false),
                    w.take(p + ".router.scale", {H}),
                    w.take(p + ".router.per_expert_scale", {a.num_experts}),
                    a.rms_norm_eps,
                    a.top_k_experts,
                    std::pow(H, -0.5)};
      nn::SwitchGLU experts = nn::SwitchGLU::load(w, p + ".experts.switch_glu", H,
                                                  a.moe_intermediate_size, a.num_experts, false);
      experts.activation = [](const mx::array& x_up, const mx::array& x_gate) {
        return geglu(x_gate, x_up);
      };
      moe = MoE{std::move(router), std::move(experts),
                norm(w, p + ".post_feedforward_layernorm_1", a),
                norm(w, p + ".post_feedforward_layernorm_2", a),
                norm(w, p + ".pre_feedforward_layernorm_2", a)};
    }
    if (const int Hp = a.hidden_size_per_layer_input) {
      per_layer = PerLayerInput{nn::Linear::load(w, p + ".per_layer_input_gate", H, Hp, false),
                                nn::Linear::load(w, p + ".per_layer_projection", Hp, H, false),
                                norm(w, p + ".post_per_layer_input_norm", a)};
    }
  }

  static nn::RMSNorm norm(WeightStore& w, const std::string& path, const Args& a) {
    return nn::RMSNorm::load(w, path, a.hidden_size, a.rms_norm_eps);
  }

  std::pair<mx::array, SharedKV> operator()(const mx::array& x, const Mask& mask,
                                            KVCacheBase* cache,
                                            const std::optional<mx::array>& per_layer_input,
                                            const SharedKV* shared) const {
    auto [attn, kv] = self_attn(input_layernorm(x), mask, cache, shared);
    mx::array h = mx::add(x, post_attention_layernorm(attn));
    mx::array residual = h;
    if (moe) {
      mx::array h1 = moe->post_feedforward_layernorm_1(mlp(pre_feedforward_layernorm(h)));
      auto [idx, weights] = moe->router(h);
      mx::array h2 = moe->experts(moe->pre_feedforward_layernorm_2(h), idx);
      h2 = mx::sum(mx::multiply(mx::expand_dims(weights, -1), h2), -2);
      h = mx::add(h1, moe->post_feedforward_layernorm_2(h2));
    } else {
      h = mlp(pre_feedforward_layernorm(h));
    }
    h = mx::add(residual, post_feedforward_layernorm(h));
    if (per_layer && per_layer_input) {
      mx::array gate = nn::gelu_approx(per_layer->per_layer_input_gate(h));
      gate = per_layer->per_layer_projection(mx::multiply(gate, *per_layer_input));
      h = mx::add(h, per_layer->post_per_layer_input_norm(gate));
    }
    return {mx::multiply(h, layer_scalar), kv};
  }
};

// A Python float meeting an array of x's dtype (weak scalar).
mx::array weak(double value, const mx::array& x) {
  return mx::array(static_cast<float>(value), x.dtype());
}

class Gemma4Text : public Model {
 public:
  Gemma4Text(Args a, WeightStore& w, const std::string& prefix, const std::string& source)
      : args_(std::move(a)),
        embed_tokens_(nn::Embedding::load(w, prefix + "model.embed_tokens", args_.vocab_size,
                                          args_.hidden_size)),
        norm_(nn::RMSNorm::load(w, prefix + "model.norm", args_.hidden_size, args_.rms_norm_eps)) {
    const int L = args_.num_hidden_layers, H = args_.hidden_size;
    for (int i = 0; i < L; ++i)
      layers_.emplace_back(args_, i, w, prefix + "model.layers." + std::to_string(i), source);
    if (const int Hp = args_.hidden_size_per_layer_input) {
      embed_tokens_per_layer_ = nn::Embedding::load(w, prefix + "model.embed_tokens_per_layer",
                                                    args_.vocab_size_per_layer_input, L * Hp);
      per_layer_model_projection_ =
          nn::Linear::load(w, prefix + "model.per_layer_model_projection", H, L * Hp, false);
      per_layer_projection_norm_ =
          nn::RMSNorm::load(w, prefix + "model.per_layer_projection_norm", Hp, args_.rms_norm_eps);
    }
    if (!args_.tie_word_embeddings)
      lm_head_ = nn::Linear::load(w, prefix + "lm_head", H, args_.vocab_size, false);
    // Each KV-shared layer reads the last donor layer of its type.
    std::map<std::string, int> donor;
    for (int i = 0; i < L; ++i) {
      if (i < args_.first_kv_shared()) {
        donor[args_.layer_types[i]] = i;
        previous_kvs_.push_back(i);
      } else {
        auto it = donor.find(args_.layer_types[i]);
        check(it != donor.end(), source, "KV-shared layer ", i, " (", args_.layer_types[i],
              ") has no earlier layer of its type to share K/V with");
        previous_kvs_.push_back(it->second);
      }
    }
    if (args_.final_logit_softcapping) {
      const double cap = *args_.final_logit_softcapping;
      softcap_ = mx::compile(
          [cap](const std::vector<mx::array>& in) {
            const mx::array& x = in[0];
            return std::vector<mx::array>{
                mx::multiply(mx::tanh(mx::divide(x, weak(cap, x))), weak(cap, x))};
          },
          /*shapeless=*/true);
    }
  }

  mx::array hidden(const mx::array& tokens, Cache& cache) override {
    check(static_cast<int>(cache.size()) == args_.first_kv_shared(), "gemma4", "got ", cache.size(),
          " caches, expected one per donor layer (", args_.first_kv_shared(), ")");
    const int L = tokens.shape(1), n_layers = num_layers();
    mx::array embeds = embed_tokens_(tokens);
    mx::array h = mx::multiply(embeds, weak(std::pow(args_.hidden_size, 0.5), embeds));

    std::vector<std::optional<mx::array>> per_layer_inputs(n_layers);
    if (const int Hp = args_.hidden_size_per_layer_input) {
      mx::array pli = (*embed_tokens_per_layer_)(tokens);
      pli = mx::unflatten(mx::multiply(pli, weak(std::pow(Hp, 0.5), pli)), -1, {n_layers, Hp});
      mx::array proj = (*per_layer_model_projection_)(h);
      proj = mx::multiply(proj, weak(std::pow(args_.hidden_size, -0.5), proj));
      proj = (*per_layer_projection_norm_)(mx::unflatten(proj, -1, {n_layers, Hp}));
      pli = mx::add(proj, pli);
      pli = mx::multiply(pli, weak(std::pow(2.0, -0.5), pli));  // (B, L, layers, Hp)
      for (int i = 0; i < n_layers; ++i) {
        mx::Shape lo{0, 0, i, 0}, hi = pli.shape();
        hi[2] = i + 1;
        per_layer_inputs[i] = mx::squeeze(mx::slice(pli, lo, hi), 2);
      }
    }

    // One mask per layer type, from the first layer of that type.
    std::map<std::string, Mask> masks;
    for (int i = 0; i < n_layers; ++i) {
      const std::string& type = args_.layer_types[i];
      if (masks.count(type)) continue;
      std::optional<int> window;
      if (args_.is_sliding(i)) window = args_.sliding_window;
      KVCacheBase* c = i < args_.first_kv_shared() ? cache[i].get() : nullptr;
      masks[type] = c ? c->make_mask(L, window) : uncached_mask(L, window);
    }

    std::vector<std::optional<SharedKV>> intermediates(n_layers);
    for (int i = 0; i < n_layers; ++i) {
      const int prev = previous_kvs_[i];
      const SharedKV* shared = prev != i && intermediates[prev] ? &*intermediates[prev] : nullptr;
      KVCacheBase* c = i < args_.first_kv_shared() ? cache[i].get() : nullptr;
      auto [out, kv] =
          layers_[i](h, masks.at(args_.layer_types[i]), c, per_layer_inputs[i], shared);
      h = out;
      intermediates[i] = std::move(kv);
      if (tap_) tap_->on_layer(i, h);
    }
    h = norm_(h);
    if (tap_) tap_->on_final(h);
    return h;
  }

  mx::array operator()(const mx::array& tokens, Cache& cache) override {
    mx::array h = hidden(tokens, cache);
    mx::array out = lm_head_ ? (*lm_head_)(h) : embed_tokens_.as_linear(h);
    return softcap_ ? softcap_({out})[0] : out;
  }

  // Caches for the donor layers only: KVCache for full, RotatingKVCache for sliding layers.
  Cache make_cache() const override {
    Cache c;
    for (int i = 0; i < args_.first_kv_shared(); ++i) {
      if (args_.is_sliding(i)) {
        c.push_back(std::make_unique<RotatingKVCache>(args_.sliding_window));
      } else {
        c.push_back(std::make_unique<KVCache>());
      }
    }
    return c;
  }

  int num_layers() const override { return static_cast<int>(layers_.size()); }

 private:
  // create_attention_mask(h, None, window) for a first-of-its-type layer without a cache.
  static Mask uncached_mask(int n, std::optional<int> window) {
    if (n == 1) return {};
    if (window && n > *window) return {"", create_causal_mask(n, 0, window)};
    return {"causal", std::nullopt};
  }

  Args args_;
  nn::Embedding embed_tokens_;
  std::vector<DecoderLayer> layers_;
  nn::RMSNorm norm_;
  std::optional<nn::Embedding> embed_tokens_per_layer_;
  std::optional<nn::Linear> per_layer_model_projection_;
  std::optional<nn::RMSNorm> per_layer_projection_norm_;
  std::optional<nn::Linear> lm_head_;
  std::vector<int> previous_kvs_;
  std::function<std::vector<mx::array>(const std::vector<mx::array>&)> softcap_;
};

std::unique_ptr<Model> build(const json& c, WeightStore& w) {
  return build_gemma4_text(c, w, "", "config.json");
}

void sanitize(const json& c, Weights& w) { sanitize_gemma4_text(c, w); }

const ArchitectureRegistrar kGemma4Text("gemma4_text", {sanitize, build});

}  // namespace

std::unique_ptr<Model> build_gemma4_text(const json& text_config, WeightStore& weights,
                                         const std::string& prefix, const std::string& source) {
  return std::make_unique<Gemma4Text>(parse_args(text_config, source), weights, prefix, source);
}

// Drops rotary tables, activation ranges and the K/V projections of KV-shared layers; splits
// Hugging Face's fused experts.gate_up_proj into SwitchGLU's gate_proj / up_proj.
void sanitize_gemma4_text(const json& c, Weights& w) {
  JsonView v{c, "config.json"};
  const int first_shared =
      v.get<int>("num_hidden_layers", 35) - v.get<int>("num_kv_shared_layers", 20);
  auto has = [](const std::string& k, std::initializer_list<const char*> parts) {
    for (const char* s : parts)
      if (k.find(s) != std::string::npos) return true;
    return false;
  };
  auto layer_of = [](const std::string& k) -> std::optional<int> {
    const size_t at = k.find("layers.");
    if (at == std::string::npos) return std::nullopt;
    const std::string rest = k.substr(at + 7, k.find('.', at + 7) - (at + 7));
    if (rest.empty() || rest.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    return std::stoi(rest);
  };
  Weights out;
  for (auto& [k, t] : w) {
    if (has(k, {"self_attn.rotary_emb", "input_max", "input_min", "output_max", "output_min"}))
      continue;
    if (has(k, {".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.k_norm"})) {
      auto layer = layer_of(k);
      if (layer && *layer >= first_shared) continue;
    }
    if (k.ends_with(".experts.gate_up_proj")) {
      const std::string base = k.substr(0, k.size() - std::string(".gate_up_proj").size());
      std::vector<mx::array> parts = mx::split(t, 2, -2);
      out.insert_or_assign(base + ".switch_glu.gate_proj.weight", mx::contiguous(parts[0]));
      out.insert_or_assign(base + ".switch_glu.up_proj.weight", mx::contiguous(parts[1]));
      continue;
    }
    if (k.ends_with(".experts.down_proj")) {
      const std::string base = k.substr(0, k.size() - std::string(".down_proj").size());
      out.insert_or_assign(base + ".switch_glu.down_proj.weight", t);
      continue;
    }
    out.insert_or_assign(k, t);
  }
  w = std::move(out);
}

}  // namespace lmx
