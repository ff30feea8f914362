// What a model needs in memory, from config.json and the safetensors headers alone (no weights
// read): the weights' bytes, the KV cache's bytes for a context (the cache layout the model's
// make_cache builds: layers with a cache, KV heads and head dims, sliding-window layers capped
// at their window, gemma4's KV-shared layers without one, quantized KV), and an estimate of the
// transient memory of a prefill chunk. `lmx fit` prints it; the scheduler's memory admission
// (SchedulerOptions::memory_budget) checks requests against it.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"

namespace lmx {

// The KV cache of one decoder layer: per token, kv_heads x (k_dim + v_dim) values.
struct LayerKV {
  int layer = 0;
  int kv_heads = 0;
  int k_dim = 0, v_dim = 0;
  int window = 0;  // > 0: a rotating cache holding at most this many tokens
};

struct ModelMemory {
  std::string model_type;
  size_t weight_bytes = 0;  // sum of the tensors' bytes over model*.safetensors
  int num_layers = 0;
  std::vector<LayerKV> kv;  // the layers that own a cache, in order
  // The hybrids' linear-attention states (conv + recurrent), fixed whatever the context.
  size_t state_bytes = 0;
  std::string kv_dtype;  // the activations' dtype the cache stores: the embedding's
  int kv_dtype_bytes = 0;
  std::optional<int> max_context;  // max_position_embeddings
  // For the transient estimate.
  int hidden_size = 0, intermediate_size = 0, num_attention_heads = 0, vocab_size = 0;
};

// Reads config.json (its text_config for the multimodal wrappers) and the model*.safetensors
// headers of `dir`. Throws lmx::Error naming the file and key.
ModelMemory model_memory(const std::filesystem::path& dir);
// The same from an already parsed config.json and the weights' bytes and dtype.
ModelMemory model_memory(const json& config, size_t weight_bytes, const std::string& kv_dtype,
                         const std::string& source);

struct KVQuant {
  int bits = 0;  // 0: the float cache
  int group_size = 64;
};

// Bytes the caches hold with `tokens` tokens in context (> 0: plus the fixed state_bytes): each
// layer's min(tokens, window) tokens,
// stored as mlx-lm's KVCache / RotatingKVCache (keys and values in kv_dtype) or QuantizedKVCache
// (uint32-packed values plus a scale and a bias per group, in kv_dtype).
size_t kv_bytes(const ModelMemory& m, long long tokens, const KVQuant& quant = {});
// What the next token costs at `tokens` tokens in context (the layers whose window is full add 0).
double kv_bytes_per_token(const ModelMemory& m, long long tokens, const KVQuant& quant = {});

// An upper estimate of the memory a forward of `chunk` tokens over a context of `context`
// tokens allocates beyond weights and cache: the attention scores (float32, all heads,
// chunk x context), the MLP's three intermediate activations, four hidden-sized activations
// (kv_dtype) and the last position's logits with their log-softmax (float32).
size_t transient_bytes(const ModelMemory& m, long long chunk, long long context);

// Available memory of this machine: MemAvailable of /proc/meminfo (the CPU backend's arrays live
// in host memory). 0 when unknown.
size_t available_memory_bytes();

}  // namespace lmx
