// mlx-lm's generate_step: chunked prefill of all but the last prompt token, then one token per
// step, the next step's graph queued with async_eval before the current token is read.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <vector>

#include "models/model.h"
#include "sampling/sampler.h"

namespace lmx {

// One step's output: the token and the log-probabilities it was sampled from, (V,).
struct Step {
  int token;
  mx::array logprobs;
};

// The generator itself. `cache` may already hold a prefix of the prompt's context.
class TokenGenerator {
 public:
  TokenGenerator(Model& model, Cache& cache, std::vector<int> prompt, GenerateOptions options);
  // Waits for the step queued ahead (async_eval): a caller that stops early, at EOS or a stop
  // string, may otherwise leave it running into the process's exit.
  ~TokenGenerator();
  TokenGenerator(const TokenGenerator&) = delete;
  TokenGenerator& operator=(const TokenGenerator&) = delete;
  // Next token, or nullopt after max_tokens.
  std::optional<Step> next();
  const GenerationStats& stats() const { return stats_; }

 private:
  std::pair<mx::array, mx::array> step(const mx::array& input, bool generated);

  Model& model_;
  Cache& cache_;
  GenerateOptions opt_;
  std::optional<mx::array> history_;  // tokens seen, for logits processors
  std::optional<mx::array> y_, logprobs_;
  int n_ = 0;
  GenerationStats stats_;
  std::chrono::steady_clock::time_point start_, first_token_;
};

// mlx-lm's maybe_quantize_kv_cache: with kv_bits set, every cache that has a quantized form and
// holds >= quantized_kv_start tokens is replaced by it. A layer listed in kv_config is instead
// quantized at its own bits once its cache holds a token. Sliding-window caches become
// RotatingQuantizedKVCache (where mlx-lm raises NotImplementedError).
void maybe_quantize_kv_cache(Cache& cache, const GenerateOptions& options);

// Streams tokens to `on_token` until max_tokens, an EOS id, or on_token returning false.
GenerationStats generate(Model& model, const std::vector<int>& prompt,
                         const GenerateOptions& options, const std::vector<int>& eos_ids,
                         const std::function<bool(const Step&)>& on_token);
// The same continuing from `cache`, which already holds the context before `prompt`.
GenerationStats generate(Model& model, Cache& cache, const std::vector<int>& prompt,
                         const GenerateOptions& options, const std::vector<int>& eos_ids,
                         const std::function<bool(const Step&)>& on_token);

}  // namespace lmx
