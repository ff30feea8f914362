// lmx public C++ API: load an MLX-format model directory, tokenize, generate with options and a
// streaming callback. Everything MLX stays behind this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lmx {

std::string version();
// "cpu" or "cuda (<device name>)": what MLX runs on in this build.
std::string backend_description();

// mlx-lm's make_sampler arguments.
struct SamplerOptions {
  float temp = 0.0f;   // 0: greedy (argmax)
  float top_p = 0.0f;  // applied when 0 < top_p < 1
  float min_p = 0.0f;
  int min_tokens_to_keep = 1;
  int top_k = 0;
};

// mlx-lm's make_logits_processors arguments.
struct LogitsProcessorOptions {
  std::vector<std::pair<int, float>> logit_bias;
  std::optional<float> repetition_penalty;
  int repetition_context_size = 20;
  std::optional<float> presence_penalty;
  int presence_context_size = 20;
  std::optional<float> frequency_penalty;
  int frequency_context_size = 20;
  bool any() const {
    return !logit_bias.empty() || (repetition_penalty && *repetition_penalty != 0) ||
           (presence_penalty && *presence_penalty != 0) ||
           (frequency_penalty && *frequency_penalty != 0);
  }
};

struct GenerateOptions {
  int max_tokens = 256;
  int prefill_step_size = 2048;
  SamplerOptions sampler;
  LogitsProcessorOptions processors;
  std::optional<uint64_t> seed;
  bool ignore_eos = false;  // benchmarks: always generate max_tokens
  // mlx-lm's KV-cache quantization (--kv-bits, --kv-group-size, --quantized-kv-start): after each
  // prefill chunk and each step, caches holding >= quantized_kv_start tokens are quantized.
  std::optional<int> kv_bits;  // unset: off
  int kv_group_size = 64;
  int quantized_kv_start = 5000;
};

struct GenerationStats {
  int prompt_tokens = 0;
  double prompt_seconds = 0;  // until the first token is ready
  int generation_tokens = 0;
  double generation_seconds = 0;  // from the first token to the last
  size_t peak_memory = 0;         // bytes, MLX's peak
  size_t kv_bytes = 0;            // the KV cache at the end, allocated bytes
  double kv_bytes_per_token = 0;  // what one more cached token costs, all layers together
  double prompt_tps() const { return prompt_seconds > 0 ? prompt_tokens / prompt_seconds : 0; }
  // mlx-lm's convention: tokens over the time since the first token was ready.
  double generation_tps() const {
    return generation_seconds > 0 ? generation_tokens / generation_seconds : 0;
  }
};

// One generated token and the text it completed (may be empty while a UTF-8 sequence or a
// multi-token character is still open). A last call with token -1 flushes held-back text.
struct TokenOutput {
  int token;
  std::string_view text;
};

// Which implementation runs a model (docs/cpu.md).
struct LoadOptions {
  // Tier L1: stock MLX ops only, logits bit-identical to mlx-lm. Off (the default, tier L3):
  // on the CPU, quantized matmuls run lmx's SIMD kernels (float32 accumulation).
  bool exact = false;
};

// What a model loaded with these options runs on, e.g. "L3 (lmx CPU kernels: avx512, 2 threads)"
// or "L1 (exact: stock MLX ops)".
std::string tier_description(const LoadOptions& options = {});

class LanguageModel {
 public:
  // Loads config.json, model*.safetensors, tokenizer.json from `dir`. Throws lmx::Error.
  static LanguageModel load(const std::filesystem::path& dir, const LoadOptions& options = {});
  ~LanguageModel();
  LanguageModel(LanguageModel&&) noexcept;
  LanguageModel& operator=(LanguageModel&&) noexcept;

  const std::string& model_type() const;
  std::optional<int> context_length() const;
  std::vector<int> eos_token_ids() const;
  int vocab_size() const;
  // The tier this model runs (tier_description).
  std::string tier() const;

  std::vector<int> encode(std::string_view text, bool add_special_tokens = true) const;
  std::string decode(const std::vector<int>& ids) const;

  // Streams tokens until max_tokens, an EOS token, or `on_token` returning false. Throws
  // lmx::Error for a prompt longer than the context or invalid options.
  GenerationStats generate(const std::vector<int>& prompt, const GenerateOptions& options,
                           const std::function<bool(const TokenOutput&)>& on_token);

  struct Impl;

 private:
  explicit LanguageModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lmx
