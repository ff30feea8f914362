// HF safetensors -> MLX, reproducing mlx_lm.convert (mlx-lm 0.32): load with the architecture's
// sanitize, cast floating parameters to the dtype, quantize Linear/Embedding weights whose last dim
// divides by the group size, save like save_model / save_config, copy the tokenizer files.
#include <chrono>
#include <cstdio>
#include <set>

#include "convert/common.h"
#include "convert/convert.h"
#include "convert/mlx_writer.h"
#include "core/error.h"
#include "models/model.h"
#include "models/qwen3_next.h"

namespace lmx::convert {

namespace fs = std::filesystem;

namespace {

// Architectures whose sanitize is reproduced here, the hybrids, which run mlx-lm's sanitize of
// those families as the loader does (models/qwen3_next.h), and the families converted through
// their registered architecture: its sanitize (mlx-lm's Model.sanitize), then a build of the
// model from the result, which checks every tensor's name and shape as mlx-lm's strict load does.
const std::set<std::string> kSupportedTypes = {
    "llama", "mistral", "qwen2", "qwen3", "gemma3_text", "qwen3_next", "qwen3_5",   "qwen3_5_moe",
    "phi3",  "gemma2",  "olmo2", "glm4",  "granite",     "smollm3",    "qwen3_moe", "gpt_oss"};
const std::set<std::string> kHybridTypes = {"qwen3_next", "qwen3_5", "qwen3_5_moe"};
const std::set<std::string> kRegisteredTypes = {"phi3",    "gemma2",  "olmo2",     "glm4",
                                                "granite", "smollm3", "qwen3_moe", "gpt_oss"};

// Tokenizer and side files mlx-lm's save writes or copies (tokenizer.save_pretrained writes the
// tokenizer files; *.py and generation_config.json are copied).
const char* kCopiedFiles[] = {"tokenizer.json",
                              "tokenizer_config.json",
                              "special_tokens_map.json",
                              "tokenizer.model",
                              "vocab.json",
                              "merges.txt",
                              "added_tokens.json",
                              "chat_template.jinja",
                              "chat_template.json",
                              "generation_config.json"};

// mlx-lm quantizes modules with `to_quantized` (Linear, Embedding, SwitchLinear). In these
// architectures those are the 2-D `.weight` tensors and the 3-D experts (switch_mlp, gpt_oss's
// experts); norms are 1-D, the hybrids' conv1d weights 3-D.
bool is_quantizable(const std::string& name, const mx::array& w) {
  return ends_with(name, ".weight") &&
         (w.ndim() == 2 || (w.ndim() == 3 && (name.find(".switch_mlp.") != std::string::npos ||
                                              name.find(".experts.") != std::string::npos)));
}

// The families' quant_predicate. The hybrids: the MoE routers (mlp.gate, mlp.shared_expert_gate)
// at 8 bits, group 64 (qwen3_5: only when the model has experts); qwen3_moe: mlp.gate; gpt_oss:
// the router; granite: o_proj, down_proj and lm_head (small block absmax).
std::optional<QuantParams> quant_override(const std::string& model_type, const ojson& config,
                                          const std::string& module) {
  const QuantParams eight{64, 8};
  if (model_type == "qwen3_moe")
    return ends_with(module, "mlp.gate") ? std::optional(eight) : std::nullopt;
  if (model_type == "gpt_oss")
    return ends_with(module, "router") ? std::optional(eight) : std::nullopt;
  if (model_type == "granite") {
    const bool high = ends_with(module, "self_attn.o_proj") || ends_with(module, "mlp.down_proj") ||
                      module == "lm_head";
    return high ? std::optional(eight) : std::nullopt;
  }
  if (!kHybridTypes.count(model_type)) return std::nullopt;
  if (model_type != "qwen3_next") {
    const ojson& t = config.contains("text_config") ? config["text_config"] : config;
    if (!t.contains("num_experts") || !t["num_experts"].is_number() ||
        t["num_experts"].get<int>() <= 0)
      return std::nullopt;
  }
  if (ends_with(module, "mlp.gate") || ends_with(module, "shared_expert_gate"))
    return QuantParams{64, 8};
  return std::nullopt;
}

}  // namespace

void convert_hf(const ConvertOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path& src = opt.src;
  check(fs::is_directory(src), src.string(),
        "not a directory (expected a Hugging Face model directory or a .gguf file)");
  const fs::path config_path = src / "config.json";
  check(fs::is_regular_file(config_path), config_path.string(), "file not found");
  ojson config = read_ojson(config_path);
  check(config.is_object(), config_path.string(), "is not a JSON object");

  // mlx-lm load_config: generation_config.json's eos_token_id (when truthy) replaces config's.
  if (const fs::path gc = src / "generation_config.json"; fs::is_regular_file(gc)) {
    try {
      const ojson g = read_ojson(gc);
      if (g.is_object() && g.contains("eos_token_id")) {
        const ojson& e = g["eos_token_id"];
        const bool truthy = (e.is_number() && e.get<double>() != 0) || (e.is_array() && !e.empty());
        if (truthy) config["eos_token_id"] = e;
      }
    } catch (const Error&) {
      // mlx-lm ignores an unparsable generation_config.json.
    }
  }

  check(config.contains("model_type") && config["model_type"].is_string(), config_path.string(),
        "missing required key 'model_type'");
  const std::string model_type = config["model_type"].get<std::string>();
  if (!kSupportedTypes.count(model_type)) {
    std::string list;
    for (const auto& t : kSupportedTypes) list += (list.empty() ? "" : ", ") + t;
    fail(config_path.string(), "model_type '", model_type, "' is not supported by lmx convert (",
         list, ")");
  }
  const bool registered = kRegisteredTypes.count(model_type) > 0;
  // mlx-lm load_model's legacy quantization_config: OpenAI's MXFP4 checkpoints (gpt-oss) keep
  // their packed experts, and the config records the mode in both blocks.
  std::optional<QuantParams> prequantized;
  if (registered && !config.contains("quantization") && config.contains("quantization_config") &&
      config["quantization_config"].is_object() &&
      config["quantization_config"].value("quant_method", std::string()) == "mxfp4") {
    prequantized = QuantParams{32, 4};
    const ojson q = {{"group_size", 32}, {"bits", 4}, {"mode", "mxfp4"}};
    config["quantization"] = q;
    config["quantization_config"] = q;
  }
  check(
      prequantized || (!config.contains("quantization") && !config.contains("quantization_config")),
      config_path.string(),
      "the model is already quantized (config has a quantization block), expected a float "
      "checkpoint or gpt-oss's mxfp4 quantization_config");

  if (opt.verbose) std::fprintf(stderr, "[INFO] Loading %s\n", src.string().c_str());
  Weights weights = load_model_weights(src);

  const bool hybrid = kHybridTypes.count(model_type) > 0;
  // qwen3_5.TextModelArgs.__post_init__ renames rope_parameters' rope_type to type in the config
  // dict itself, which mlx_lm.convert then saves.
  if (model_type.starts_with("qwen3_5")) {
    ojson& t = config.contains("text_config") && config["text_config"].is_object()
                   ? config["text_config"]
                   : config;
    if (t.contains("rope_parameters") && t["rope_parameters"].is_object()) {
      ojson& rp = t["rope_parameters"];
      if (!rp.contains("type") && rp.contains("rope_type")) {
        ojson type = rp["rope_type"];
        rp.erase("rope_type");
        rp["type"] = type;
      }
    }
  }
  if (hybrid) {
    const json c = json::parse(config.dump());
    if (model_type == "qwen3_next") {
      hybrid::sanitize_qwen3_next(c, weights);
    } else if (model_type == "qwen3_5") {
      hybrid::sanitize_qwen3_5(c, weights);
    } else {
      hybrid::sanitize_qwen3_5_moe(c, weights);
    }
  }
  if (registered) {
    const json c = json::parse(config.dump());
    const Architecture* arch = find_architecture(model_type);
    check(arch != nullptr, "convert", "model_type '", model_type, "' is not registered");
    if (arch->sanitize) arch->sanitize(c, weights);
    WeightStore store(weights, QuantConfig::from_config(c, config_path.string()), src.string());
    try {
      (void)arch->build(c, store);
    } catch (const json::exception& e) {
      fail(config_path.string(), "invalid config: ", e.what());
    }
    store.check_all_used();
  }
  // sanitize (llama, qwen2): drop precomputed rotary frequencies.
  for (auto it = weights.begin(); !hybrid && !registered && it != weights.end();) {
    if (it->first.find("self_attn.rotary_emb.inv_freq") != std::string::npos) {
      it = weights.erase(it);
    } else {
      ++it;
    }
  }
  // sanitize: drop the head when tied. ModelArgs defaults: llama/qwen2 tie when the key is
  // missing, qwen3 requires it, gemma3_text ties when the checkpoint has no lm_head.
  bool tie = false;
  if (hybrid || registered) {
    // Done by the architecture's sanitize above.
  } else if (model_type == "gemma3_text") {
    tie = !weights.count("lm_head.weight");
  } else if (config.contains("tie_word_embeddings") && !config["tie_word_embeddings"].is_null()) {
    check(config["tie_word_embeddings"].is_boolean(), config_path.string(),
          "tie_word_embeddings is not a boolean");
    tie = config["tie_word_embeddings"].get<bool>();
  } else {
    check(model_type != "qwen3", config_path.string(),
          "missing required key 'tie_word_embeddings' (qwen3)");
    tie = true;
  }
  if (tie) {
    weights.erase("lm_head.weight");
  } else if (!hybrid && !registered) {
    check(weights.count("lm_head.weight"), src.string(),
          "tie_word_embeddings is false but there is no lm_head.weight tensor");
  }
  const std::string embed =
      std::string(model_type.starts_with("qwen3_5") ? "language_model." : "") +
      "model.embed_tokens.weight";
  check(weights.count(embed), src.string(), "no ", embed, " tensor (not a ", model_type,
        " checkpoint?)");

  // dtype: the flag, else config torch_dtype, else text_config.dtype; only these three cast.
  std::optional<std::string> dtype_name = opt.dtype;
  if (!dtype_name && config.contains("torch_dtype") && config["torch_dtype"].is_string())
    dtype_name = config["torch_dtype"].get<std::string>();
  if (!dtype_name && config.contains("text_config") && config["text_config"].is_object() &&
      config["text_config"].contains("dtype") && config["text_config"]["dtype"].is_string())
    dtype_name = config["text_config"]["dtype"].get<std::string>();
  if (opt.dtype) {
    check(parse_dtype(*opt.dtype).has_value(), "convert", "--dtype '", *opt.dtype,
          "' is not supported, expected float16, bfloat16 or float32");
  }
  if (dtype_name) {
    if (auto dt = parse_dtype(*dtype_name)) {
      if (opt.verbose) std::fprintf(stderr, "[INFO] Using dtype: %s\n", dtype_name->c_str());
      // qwen3_5's cast_predicate keeps A_log in its dtype.
      const bool keep_a_log = model_type.starts_with("qwen3_5");
      for (auto& [k, v] : weights)
        if (mx::issubdtype(v.dtype(), mx::floating) && !(keep_a_log && ends_with(k, "A_log")))
          v = mx::astype(v, *dt);
    }
  }

  QuantMap quantized;
  std::set<std::string> packed;  // modules the checkpoint already holds quantized
  if (prequantized) {
    for (const auto& [k, v] : weights) {
      if (!ends_with(k, ".scales")) continue;
      const std::string module = k.substr(0, k.size() - std::string(".scales").size());
      packed.insert(module);
      quantized[module] = *prequantized;
    }
  }
  if (opt.quantize) {
    const int bits = opt.q_bits.value_or(4);
    const int group = opt.q_group_size.value_or(64);
    check_quant_params(bits, group);
    if (opt.verbose) std::fprintf(stderr, "[INFO] Quantizing\n");
    std::vector<std::string> names;
    for (const auto& [k, v] : weights) {
      if (!is_quantizable(k, v)) continue;
      const std::string prefix = k.substr(0, k.size() - std::string(".weight").size());
      if (!packed.count(prefix) && v.shape(-1) % group == 0) names.push_back(k);
    }
    QuantMap overrides;
    std::vector<std::string> plain;  // quantized with the defaults
    for (const auto& name : names) {
      const mx::array w = weights.at(name);
      const std::string prefix = name.substr(0, name.size() - std::string(".weight").size());
      QuantParams p{group, bits};
      if (auto o = quant_override(model_type, config, prefix)) {
        p = overrides[prefix] = *o;
      } else {
        plain.push_back(prefix);
      }
      auto q = mx::quantize(w, p.group_size, p.bits);
      weights.erase(name);
      weights.emplace(prefix + ".weight", q[0]);
      weights.emplace(prefix + ".scales", q[1]);
      weights.emplace(prefix + ".biases", q[2]);
      quantized[prefix] = p;
    }
    if (prequantized) {
      // mlx-lm quantize_model on a partly quantized model keeps its block and records every
      // module it quantizes (the predicate's dict as given, else the defaults with the mode).
      ojson& q = config["quantization"];
      for (const auto& m : plain)
        q[m] = {{"group_size", group}, {"bits", bits}, {"mode", "affine"}};
      for (const auto& [m, p] : overrides) q[m] = {{"group_size", p.group_size}, {"bits", p.bits}};
    } else {
      config["quantization"] = quantization_block({group, bits}, overrides);
    }
  } else {
    check(!opt.q_bits && !opt.q_group_size, "convert",
          "--q-bits / --q-group-size need -q (--quantize)");
  }

  StagingDir out(opt.dst);
  save_weights(out.path(), weights, quantized, 5ull << 30, opt.verbose);
  save_config(out.path() / "config.json", config);
  for (const char* f : kCopiedFiles) {
    const fs::path p = src / f;
    if (!fs::is_regular_file(p)) continue;
    std::error_code ec;
    fs::copy_file(p, out.path() / f, fs::copy_options::overwrite_existing, ec);
    check(!ec, p.string(), "cannot copy: ", ec.message());
  }
  for (const auto& e : fs::directory_iterator(src)) {
    if (e.path().extension() != ".py" || !e.is_regular_file()) continue;
    std::error_code ec;
    fs::copy_file(e.path(), out.path() / e.path().filename(), fs::copy_options::overwrite_existing,
                  ec);
    check(!ec, e.path().string(), "cannot copy: ", ec.message());
  }
  out.commit();
  if (opt.verbose) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "[INFO] Wrote %s (%zu tensors, %zu quantized modules) in %.1f s\n",
                 opt.dst.string().c_str(), weights.size(), quantized.size(), s);
  }
}

}  // namespace lmx::convert
