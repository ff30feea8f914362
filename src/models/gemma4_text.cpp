// Gemma 4 text: mlx_lm/models/gemma4_text.py's Gemma4TextModel and Model. Sliding / full layers
// from layer_types (default: every sliding_window_pattern-th is full), each with its own RoPE
// from rope_parameters (full: "proportional", rotating the leading partial_rotary_factor of a
// wider global_head_dim). The last num_kv_shared_layers layers own no K/V: they attend to the
// cached K/V of the last earlier layer of their type (only donor layers have caches). Optional
// per-layer input embeddings (E2B/E4B) and a final logit softcap. The layers (attention, MLP,
// MoE, per-layer inputs) are in gemma4_layers.cpp, ModelArgs and sanitize in gemma4_args.cpp.
#include "models/gemma4_text.h"

#include <cmath>
#include <map>

#include "cache/rotating_kv_cache.h"
#include "models/gemma4_layers.h"

namespace lmx {
namespace {

using gemma4::Args;
using gemma4::DecoderLayer;
using gemma4::SharedKV;
using gemma4::weak;

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
  bool batches_rows() const override { return false; }

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
  return std::make_unique<Gemma4Text>(gemma4::parse_args(text_config, source), weights, prefix,
                                      source);
}

}  // namespace lmx
