#include "generate/dflash.h"

#include <cmath>

#include "cache/kv_cache.h"
#include "core/error.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "lmx/lmx.h"
#include "nn/rope_config.h"

namespace lmx {

namespace fs = std::filesystem;

namespace {

// As the published code (dflash 0.1.0, model_mlx.py): dflash_config's block_size, else the top
// level's, else 16.
int block_size_of(const json& c, const std::string& source) {
  if (c.contains("dflash_config") && c["dflash_config"].is_object()) {
    JsonView d{c["dflash_config"], source + " dflash_config"};
    if (d.has("block_size")) return d.get<int>("block_size");
  }
  return JsonView{c, source}.get<int>("block_size", 16);
}

DFlashConfig parse_config(const json& c, const std::string& source) {
  JsonView v{c, source};
  DFlashConfig o;
  o.hidden_size = v.get<int>("hidden_size");
  o.num_hidden_layers = v.get<int>("num_hidden_layers");
  o.num_attention_heads = v.get<int>("num_attention_heads");
  o.num_key_value_heads = v.get<int>("num_key_value_heads");
  o.head_dim = v.get<int>("head_dim");
  o.intermediate_size = v.get<int>("intermediate_size");
  o.vocab_size = v.get<int>("vocab_size");
  o.rms_norm_eps = v.get<float>("rms_norm_eps");
  o.block_size = block_size_of(c, source);
  o.num_target_layers = v.get<int>("num_target_layers");
  check(v.has("dflash_config") && c["dflash_config"].is_object(), source,
        "missing required key 'dflash_config' (an object with target_layer_ids and "
        "mask_token_id)");
  JsonView d{c["dflash_config"], source + " dflash_config"};
  o.target_layer_ids = d.get<std::vector<int>>("target_layer_ids");
  o.mask_token_id = d.get<int>("mask_token_id");

  check(o.hidden_size > 0 && o.num_hidden_layers > 0 && o.num_attention_heads > 0 &&
            o.num_key_value_heads > 0 && o.head_dim > 0 && o.intermediate_size > 0,
        source, "sizes must be positive");
  check(o.num_attention_heads % o.num_key_value_heads == 0, source, "num_attention_heads ",
        o.num_attention_heads, " is not a multiple of num_key_value_heads ", o.num_key_value_heads);
  check(o.block_size >= 2, source,
        "block_size must be >= 2 (the last token and at least one "
        "mask), got ",
        o.block_size);
  check(!o.target_layer_ids.empty(), source, "dflash_config.target_layer_ids is empty");
  for (int id : o.target_layer_ids)
    check(id >= 0 && id < o.num_target_layers, source, "dflash_config.target_layer_ids has ", id,
          ", expected a layer in [0, num_target_layers = ", o.num_target_layers, ")");
  check(o.mask_token_id >= 0 && o.mask_token_id < o.vocab_size, source,
        "dflash_config.mask_token_id ", o.mask_token_id, " is outside the vocabulary of ",
        o.vocab_size);
  // The published Qwen3 drafters are all full attention; a sliding layer would need a window.
  if (v.has("layer_types")) {
    for (const auto& t : c["layer_types"])
      check(t == "full_attention", source, "layer_types has ", t.dump(),
            ", expected only \"full_attention\" (sliding drafter layers are not supported)");
  }
  check(!v.get<bool>("attention_bias", false), source,
        "attention_bias is true, expected false (the Qwen3 drafters have no projection biases)");

  // Keys the published code applies that lmx does not: refused unless at their defaults, since
  // ignoring them would change the proposals without a word.
  // (check() evaluates its message's parts: c.at() only where the key is there.)
  for (const char* k : {"input_embedding_scale", "output_multiplier"})
    if (v.has(k))
      check(v.get<double>(k) == 1.0, source, k, " is ", c.at(k).dump(),
            ", expected 1 or absent (lmx's DFlash drafter does not apply it)");
  if (v.has("final_logit_softcapping"))
    fail(source, "final_logit_softcapping is ", c.at("final_logit_softcapping").dump(),
         ", expected absent or null (not applied by lmx)");
  check(!v.get<bool>("is_causal", false), source,
        "is_causal is true, expected false (lmx's drafter attends to the whole block)");

  o.rope = nn::rope_from_config(v, o.head_dim, v.get_opt<int>("max_position_embeddings"));
  return o;
}

}  // namespace

bool is_dflash_checkpoint(const fs::path& dir) {
  const fs::path p = dir / "config.json";
  if (!fs::is_regular_file(p)) return false;
  const json c = read_json_file(p);
  if (!c.is_object()) return false;
  if (c.contains("dflash_config")) return true;
  if (c.contains("architectures") && c["architectures"].is_array())
    for (const auto& a : c["architectures"])
      if (a == "DFlashDraftModel") return true;
  return false;
}

std::shared_ptr<DFlashDrafter> DFlashDrafter::load(const fs::path& dir) {
  const std::string source = (dir / "config.json").string();
  check(fs::is_regular_file(dir / "config.json"), dir.string(),
        "no config.json, expected a DFlash drafter directory");
  const json c = read_json_file(dir / "config.json");
  check(c.is_object(), source, "expected a JSON object");
  DFlashConfig cfg = parse_config(c, source);
  WeightStore w(load_model_weights(dir), QuantConfig::from_config(c, source), dir.string());
  std::shared_ptr<DFlashDrafter> d(new DFlashDrafter(std::move(cfg), w));
  w.check_all_used();
  return d;
}

DFlashDrafter::DFlashDrafter(DFlashConfig cfg, WeightStore& w)
    : cfg_(std::move(cfg)),
      fc_(nn::Linear::load(w, "fc",
                           static_cast<int>(cfg_.target_layer_ids.size()) * cfg_.hidden_size,
                           cfg_.hidden_size, false)),
      hidden_norm_(nn::RMSNorm::load(w, "hidden_norm", cfg_.hidden_size, cfg_.rms_norm_eps)),
      norm_(nn::RMSNorm::load(w, "norm", cfg_.hidden_size, cfg_.rms_norm_eps)),
      source_(w.source()) {
  const int H = cfg_.hidden_size, D = cfg_.head_dim;
  const int q_out = cfg_.num_attention_heads * D, kv_out = cfg_.num_key_value_heads * D;
  const float eps = cfg_.rms_norm_eps;
  for (int i = 0; i < cfg_.num_hidden_layers; ++i) {
    const std::string p = "layers." + std::to_string(i);
    const std::string a = p + ".self_attn";
    layers_.push_back(Layer{
        nn::Linear::load(w, a + ".q_proj", H, q_out, false),
        nn::Linear::load(w, a + ".k_proj", H, kv_out, false),
        nn::Linear::load(w, a + ".v_proj", H, kv_out, false),
        nn::Linear::load(w, a + ".o_proj", q_out, H, false),
        nn::RMSNorm::load(w, a + ".q_norm", D, eps),
        nn::RMSNorm::load(w, a + ".k_norm", D, eps),
        nn::RMSNorm::load(w, p + ".input_layernorm", H, eps),
        nn::RMSNorm::load(w, p + ".post_attention_layernorm", H, eps),
        nn::SwiGLUMLP::load(w, p + ".mlp", H, cfg_.intermediate_size, false),
    });
  }
}

void DFlashDrafter::check_target(const Model& target) const {
  check(target.num_layers() == cfg_.num_target_layers, source_, "the drafter was made for a ",
        "target of num_target_layers = ", cfg_.num_target_layers, " layers, the model has ",
        target.num_layers());
  const mx::array e = target.embed(mx::array({cfg_.mask_token_id}, {1, 1}, mx::int32));
  check(e.shape(2) == cfg_.hidden_size, source_, "the drafter's hidden_size is ", cfg_.hidden_size,
        ", the model's ", e.shape(2), ", expected the same");
  const mx::array logits = target.head(mx::zeros({1, 1, cfg_.hidden_size}, e.dtype()));
  check(logits.shape(2) == cfg_.vocab_size, source_, "the drafter's vocab_size is ",
        cfg_.vocab_size, ", the model's head has ", logits.shape(2),
        " entries, expected the same vocabulary");
}

Cache DFlashDrafter::make_cache() const {
  Cache c;
  for (int i = 0; i < cfg_.num_hidden_layers; ++i) c.push_back(std::make_unique<KVCache>());
  return c;
}

mx::array DFlashDrafter::attention(const Layer& l, const mx::array& x, const mx::array& ctx,
                                   KVCacheBase& cache) const {
  const int S = ctx.shape(1);
  const int off = cache.offset();
  auto heads = [](const mx::array& t, const nn::RMSNorm* n, int count) {
    const int B = t.shape(0), T = t.shape(1);
    mx::array r = mx::reshape(t, {B, T, count, -1});
    if (n) r = (*n)(r);
    return mx::transpose(r, {0, 2, 1, 3});  // (B, count, T, head_dim)
  };
  const int nq = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads;
  // Context rows sit at [off, off + S), the block right after them.
  mx::array q = cfg_.rope(heads(l.q_proj(x), &l.q_norm, nq), off + S);
  mx::array bk = cfg_.rope(heads(l.k_proj(x), &l.k_norm, nkv), off + S);
  mx::array bv = heads(l.v_proj(x), nullptr, nkv);
  // Every call after the first brings the states of at least the last committed token.
  check(S > 0 || off == 0, "dflash", "no new context states for a cache holding ", off,
        " positions, expected at least one");
  mx::array keys = bk, values = bv;
  if (S > 0) {
    mx::array ck = cfg_.rope(heads(l.k_proj(ctx), &l.k_norm, nkv), off);
    mx::array cv = heads(l.v_proj(ctx), nullptr, nkv);
    auto [k_all, v_all] = cache.update_and_fetch(ck, cv);
    keys = mx::concatenate({k_all, bk}, 2);
    values = mx::concatenate({v_all, bv}, 2);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(cfg_.head_dim));
  mx::array o = mx::fast::scaled_dot_product_attention(q, keys, values, scale);
  return l.o_proj(nn::merge_heads(o));
}

mx::array DFlashDrafter::operator()(const Model& target, const mx::array& block,
                                    const mx::array& context, Cache& cache) const {
  check(block.ndim() == 2 && block.shape(0) == 1, "dflash", "the block has shape ",
        shape_str(block.shape()), ", expected (1, L)");
  const int taps = static_cast<int>(cfg_.target_layer_ids.size());
  check(context.ndim() == 3 && context.shape(2) == taps * cfg_.hidden_size, "dflash",
        "the context states have shape ", shape_str(context.shape()), ", expected (1, S, ",
        taps * cfg_.hidden_size, ")");
  check(cache.size() == layers_.size(), "dflash", "the cache has ", cache.size(),
        " layers, expected ", layers_.size());
  mx::array h = target.embed(block);
  mx::array ctx = hidden_norm_(fc_(context));
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    h = mx::add(h, attention(l, l.input_layernorm(h), ctx, *cache[i]));
    h = mx::add(h, l.mlp(l.post_attention_layernorm(h)));
  }
  return target.head(norm_(h));
}

bool is_dflash_drafter(const fs::path& dir) { return is_dflash_checkpoint(dir); }

std::shared_ptr<const DFlashDrafter> load_dflash_drafter(const fs::path& dir) {
  return DFlashDrafter::load(dir);
}

int dflash_block_size(const DFlashDrafter& drafter) { return drafter.config().block_size; }

int dflash_block_size(const fs::path& dir) {
  const std::string source = (dir / "config.json").string();
  return block_size_of(read_json_file(dir / "config.json"), source);
}

}  // namespace lmx
