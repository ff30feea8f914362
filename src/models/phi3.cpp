// Phi-3 / Phi-3.5 (`phi3`): mlx_lm/models/phi3.py. Llama's block with q/k/v in one qkv_proj and
// gate/up in one gate_up_proj, head_dim = hidden / heads, RoPE over partial_rotary_factor of the
// head, "su" / "longrope" scaling (SuScaledRoPE: long_factor frequencies, an input scale from
// max / original positions) or "linear". Untied by default.
#include "nn/transformer.h"

namespace lmx {
namespace {

constexpr const char* kSource = "config.json";

// phi3.ModelArgs, with its defaults and __post_init__ checks.
nn::DecoderOptions parse_args(const json& c) {
  JsonView v{c, kSource};
  nn::DecoderOptions o = nn::parse_decoder_keys(v, /*kv_heads_required=*/false);
  auto& a = o.attention;
  a.head_dim = a.hidden_size / a.n_heads;
  a.fused_qkv = true;
  o.fused_gate_up = true;
  o.tie_word_embeddings = v.get<bool>("tie_word_embeddings", false);
  o.shardable = false;  // phi3.py has no Model.shard
  const float theta = v.get<float>("rope_theta", 10000.0f);
  const bool traditional = v.get<bool>("rope_traditional", false);
  const int max_pos = v.get<int>("max_position_embeddings", 131072);
  const int original_max_pos = v.get<int>("original_max_position_embeddings", 4096);
  const int rope_dim = static_cast<int>(a.head_dim * v.get<double>("partial_rotary_factor", 1.0));
  a.rope = nn::make_rope(rope_dim, theta, traditional, json(), std::nullopt, kSource);
  // An empty rope_scaling is Python-false: no scaling.
  if (!v.has("rope_scaling") || c["rope_scaling"].empty()) return o;
  const json& sc = c["rope_scaling"];
  check(sc.is_object() && sc.contains("long_factor") && sc.contains("type"), kSource,
        "rope_scaling must contain keys long_factor and type, got ", sc.dump());
  const json& type = sc["type"];
  if (type == "longrope" || type == "su") {
    check(sc.contains("short_factor"), kSource, "rope_scaling of type ", type.dump(),
          " needs 'short_factor'");
    a.rope =
        nn::su_scaled_rope(rope_dim, theta, max_pos, original_max_pos, sc["long_factor"], kSource);
  } else if (type == "linear") {
    check(sc.contains("factor") && sc["factor"].is_number_float(), kSource,
          "rope_scaling of type \"linear\" needs a float 'factor', got ", sc.dump());
    a.rope.scale = static_cast<float>(1.0 / sc["factor"].get<double>());
  }
  // Any other type: mlx-lm warns and runs without scaling.
  return o;
}

std::unique_ptr<Model> build(const json& c, WeightStore& w) {
  return std::make_unique<nn::DenseDecoder>(parse_args(c), w);
}

// No sanitize, as in mlx-lm.
const ArchitectureRegistrar kPhi3("phi3", {nullptr, build});

}  // namespace
}  // namespace lmx
