#include "engine/memory.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "models/gemma4_layers.h"

namespace lmx {
namespace {

int dtype_bytes(const std::string& name, const std::string& source) {
  static const std::map<std::string, int> kBytes = {
      {"float32", 4}, {"float16", 2}, {"bfloat16", 2}, {"float64", 8}};
  auto it = kBytes.find(name);
  check(it != kBytes.end(), source, "the KV cache dtype must be a float type, got '", name, "'");
  return it->second;
}

// A wrapper's text_config with the defaults its architecture file adds (models/gemma3.cpp,
// models/gemma4.cpp); other models' config as it is.
json text_config(const json& c, const std::string& model_type) {
  if (model_type.starts_with("qwen3_5"))
    return c.contains("text_config") && c["text_config"].is_object() ? c["text_config"] : c;
  if (model_type != "gemma3" && model_type != "gemma4") return c;
  json text =
      c.contains("text_config") && c["text_config"].is_object() ? c["text_config"] : json::object();
  if (!text.contains("num_attention_heads")) text["num_attention_heads"] = 8;
  if (!text.contains("num_key_value_heads"))
    text["num_key_value_heads"] = model_type == "gemma3" ? 4 : 1;
  if (!text.contains("vocab_size") && c.contains("vocab_size"))
    text["vocab_size"] = c["vocab_size"];
  return text;
}

void gemma3_layers(const JsonView& v, ModelMemory& m) {
  const int heads = v.get<int>("num_key_value_heads", 1), dim = v.get<int>("head_dim", 256);
  const int window = v.get<int>("sliding_window", 512);
  const int pattern = v.get<int>("sliding_window_pattern", 6);
  check(pattern > 0, v.source, "sliding_window_pattern must be > 0, got ", pattern);
  for (int i = 0; i < m.num_layers; ++i) {
    const bool global = i % pattern == pattern - 1;
    m.kv.push_back({i, heads, dim, dim, global ? 0 : window});
  }
}

void gemma4_layers(const json& text, const std::string& source, ModelMemory& m) {
  const gemma4::Args a = gemma4::parse_args(text, source);
  m.num_layers = a.num_hidden_layers;
  for (int i = 0; i < a.first_kv_shared(); ++i) {
    const bool sliding = a.is_sliding(i);
    const bool k_eq_v = a.attention_k_eq_v && !sliding;
    const int heads = k_eq_v && a.num_global_key_value_heads ? *a.num_global_key_value_heads
                                                             : a.num_key_value_heads;
    const int dim = !sliding && a.global_head_dim ? a.global_head_dim : a.head_dim;
    // With k_eq_v the values are the keys, but the cache still stores both.
    m.kv.push_back({i, heads, dim, dim, sliding ? a.sliding_window : 0});
  }
  m.max_context = a.max_position_embeddings;
}

// The Qwen3-Next / Qwen3.5 hybrids (models/qwen3_next.h): a KV cache on every
// full_attention_interval-th layer; the others hold a fixed linear-attention state (ArraysCache:
// the conv state in the activations' dtype, the recurrent state in float32), whatever the context.
void hybrid_layers(const JsonView& v, ModelMemory& m) {
  const int heads = v.get<int>("num_attention_heads");
  check(heads > 0, v.source, "num_attention_heads must be > 0, got ", heads);
  const int kv_heads = v.get<int>("num_key_value_heads");
  const int dim = v.get<int>("head_dim", v.get<int>("hidden_size") / heads);
  const int interval = v.get<int>("full_attention_interval", 4);
  check(interval > 0, v.source, "full_attention_interval must be > 0, got ", interval);
  const size_t nk = v.get<int>("linear_num_key_heads"), nv = v.get<int>("linear_num_value_heads");
  const size_t dk = v.get<int>("linear_key_head_dim"), dv = v.get<int>("linear_value_head_dim");
  const size_t kernel = v.get<int>("linear_conv_kernel_dim", 4);
  const size_t conv = (kernel - 1) * (2 * nk * dk + nv * dv) * m.kv_dtype_bytes;
  for (int i = 0; i < m.num_layers; ++i) {
    if ((i + 1) % interval == 0) {
      m.kv.push_back({i, kv_heads, dim, dim, 0});
    } else {
      m.state_bytes += conv + nv * dv * dk * 4;
    }
  }
}

// llama.py-style decoders: num_key_value_heads (default: the attention heads), head_dim
// (default hidden_size / heads), layer_types' sliding_attention layers on a window.
void dense_layers(const JsonView& v, ModelMemory& m) {
  const int heads = v.get<int>("num_attention_heads");
  check(heads > 0, v.source, "num_attention_heads must be > 0, got ", heads);
  const int kv_heads = v.get<int>("num_key_value_heads", heads);
  const int dim = v.get<int>("head_dim", v.get<int>("hidden_size") / heads);
  std::vector<bool> sliding(m.num_layers, false);
  if (v.has("layer_types") && m.model_type != "starcoder2") {
    const auto types = v.get<std::vector<std::string>>("layer_types");
    check(static_cast<int>(types.size()) == m.num_layers, v.source, "layer_types has ",
          types.size(), " entries, expected num_hidden_layers = ", m.num_layers);
    for (int i = 0; i < m.num_layers; ++i) sliding[i] = types[i] == "sliding_attention";
  }
  const bool any_sliding = std::find(sliding.begin(), sliding.end(), true) != sliding.end();
  const int window = any_sliding ? v.get<int>("sliding_window") : 0;
  for (int i = 0; i < m.num_layers; ++i)
    m.kv.push_back({i, kv_heads, dim, dim, sliding[i] ? window : 0});
}

}  // namespace

ModelMemory model_memory(const json& config, size_t weight_bytes, const std::string& kv_dtype,
                         const std::string& source) {
  ModelMemory m;
  JsonView top{config, source};
  m.model_type = top.get<std::string>("model_type");
  m.weight_bytes = weight_bytes;
  m.kv_dtype = kv_dtype;
  m.kv_dtype_bytes = dtype_bytes(kv_dtype, source);
  const bool wrapper = m.model_type == "gemma3" || m.model_type == "gemma4" ||
                       (m.model_type.starts_with("qwen3_5") && config.contains("text_config"));
  const json text = text_config(config, m.model_type);
  JsonView v{text, wrapper ? source + " text_config" : source};
  if (m.model_type == "gemma4" || m.model_type == "gemma4_text") {
    gemma4_layers(text, v.source, m);
  } else {
    m.num_layers = v.get<int>("num_hidden_layers");
    if (m.model_type == "gemma3" || m.model_type == "gemma3_text")
      gemma3_layers(v, m);
    else if (m.model_type == "qwen3_next" || m.model_type.starts_with("qwen3_5"))
      hybrid_layers(v, m);
    else
      dense_layers(v, m);
    m.max_context = v.get_opt<int>("max_position_embeddings");
  }
  m.hidden_size = v.get<int>("hidden_size", 0);
  m.intermediate_size = v.get<int>("intermediate_size", 0);
  m.num_attention_heads = v.get<int>("num_attention_heads", 0);
  m.vocab_size = v.get<int>("vocab_size", top.get<int>("vocab_size", 0));
  return m;
}

ModelMemory model_memory(const std::filesystem::path& dir) {
  const std::filesystem::path config_path = dir / "config.json";
  std::ifstream in(config_path);
  check(in.good(), "[fit]", "cannot read ", config_path.string());
  json config;
  try {
    config = json::parse(in);
  } catch (const json::exception& e) {
    fail("[fit]", config_path.string(), " is not valid JSON: ", e.what());
  }
  size_t bytes = 0;
  std::string embed_dtype, scales_dtype;
  std::map<std::string, size_t> float_bytes;  // dtype -> bytes, the fallback for the KV dtype
  bool any = false;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("model") || !name.ends_with(".safetensors")) continue;
    any = true;
    MappedFile file(e.path());
    for (const TensorInfo& t : parse_safetensors_header(file).tensors) {
      bytes += t.nbytes;
      const std::string dt = t.dtype == mx::float32    ? "float32"
                             : t.dtype == mx::float16  ? "float16"
                             : t.dtype == mx::bfloat16 ? "bfloat16"
                                                       : dtype_name(t.dtype);
      if (t.name.ends_with("embed_tokens.scales")) scales_dtype = dt;
      if (t.name.ends_with("embed_tokens.weight")) embed_dtype = dt;
      if (dt == "float32" || dt == "float16" || dt == "bfloat16") float_bytes[dt] += t.nbytes;
    }
  }
  check(any, "[fit]", "no model*.safetensors in ", dir.string());
  // The embedding's output dtype (its scales' for a quantized one) is what every layer computes
  // in, and what k_proj/v_proj hand the cache.
  std::string kv_dtype = !scales_dtype.empty() ? scales_dtype : embed_dtype;
  if (kv_dtype != "float32" && kv_dtype != "float16" && kv_dtype != "bfloat16") {
    kv_dtype = "float32";
    size_t best = 0;
    for (const auto& [dt, b] : float_bytes)
      if (b > best) best = b, kv_dtype = dt;
  }
  return model_memory(config, bytes, kv_dtype, config_path.string());
}

namespace {

// The caches' bytes that grow with the context (all but the fixed linear-attention states).
size_t kv_only_bytes(const ModelMemory& m, long long tokens, const KVQuant& q) {
  size_t total = 0;
  for (const LayerKV& l : m.kv) {
    const long long held = l.window > 0 ? std::min<long long>(tokens, l.window) : tokens;
    size_t per_token = 0;
    for (int dim : {l.k_dim, l.v_dim}) {
      if (q.bits > 0) {
        // mx::quantize: dim * bits / 32 uint32 words, one scale and one bias per group.
        per_token += static_cast<size_t>(l.kv_heads) *
                     (static_cast<size_t>(dim) * q.bits / 8 +
                      2 * static_cast<size_t>(dim / q.group_size) * m.kv_dtype_bytes);
      } else {
        per_token += static_cast<size_t>(l.kv_heads) * dim * m.kv_dtype_bytes;
      }
    }
    total += per_token * static_cast<size_t>(std::max<long long>(held, 0));
  }
  return total;
}

}  // namespace

size_t kv_bytes(const ModelMemory& m, long long tokens, const KVQuant& q) {
  return (tokens > 0 ? m.state_bytes : 0) + kv_only_bytes(m, tokens, q);
}

double kv_bytes_per_token(const ModelMemory& m, long long tokens, const KVQuant& q) {
  return static_cast<double>(kv_only_bytes(m, tokens + 1, q)) -
         static_cast<double>(kv_only_bytes(m, tokens, q));
}

size_t transient_bytes(const ModelMemory& m, long long chunk, long long context) {
  const size_t c = static_cast<size_t>(std::max<long long>(chunk, 1));
  const size_t ctx = static_cast<size_t>(std::max<long long>(context, c));
  const size_t scores = c * ctx * m.num_attention_heads * 4;
  const size_t mlp = 3 * c * m.intermediate_size * m.kv_dtype_bytes;
  const size_t hidden = 4 * c * m.hidden_size * m.kv_dtype_bytes;
  const size_t logits = 2 * static_cast<size_t>(m.vocab_size) * 4;
  return scores + mlp + hidden + logits;
}

size_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("MemAvailable:")) continue;
    std::istringstream ss(line.substr(13));
    size_t kb = 0;
    ss >> kb;
    return kb * 1024;
  }
  return 0;
}

}  // namespace lmx
