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

// Checks what TokenGenerator takes beyond the sampler: prefill step, processors, KV bits and the
// per-layer kv_config of a model with num_caches layer caches. Throws lmx::Error.
void validate_generation(const GenerateOptions& options, int num_caches);

// Prompt tokens per prefill chunk: options.prefill_step_size (mlx-lm's 2048 by default), at most
// kCpuPrefillRows on tier L3 of the CPU. Its kernels run as fast in 256-row chunks as in one
// chunk of 1,000 rows, while what a chunk allocates grows with it: activations, the kernels'
// scratch and the attention scores (rows x context x heads); SmolLM2 peaks at 180 MB instead of
// 197 MB for a 1,000-token prompt (docs/memory.md). Tier L1 keeps mlx-lm's chunks.
inline constexpr int kCpuPrefillRows = 256;
int prefill_rows(const Model& model, const GenerateOptions& options);

// One prefill chunk of generate_step: `forward` runs `chunk` (1, n) into `cache`, which is then
// quantized as the options say and evaluated; `history` (the logits processors' tokens) grows
// by the chunk.
void prefill_chunk(const mx::array& chunk, Cache& cache, const GenerateOptions& options,
                   std::optional<mx::array>& history,
                   const std::function<mx::array(const mx::array&)>& forward);

// The token loop after the forward, for one row: logits (1, V) of its last position ->
// processors (history grows by `input`, the token just fed), the constraint (told `input` when it
// was generated), maybe_quantize_kv_cache, log-probabilities and the sample (drawn with `key`
// when given). Returns the token (1,) and the log-probabilities (V,).
std::pair<mx::array, mx::array> sample_next(const Model& model, mx::array logits,
                                            const mx::array& input, bool generated, Cache& cache,
                                            const GenerateOptions& options,
                                            std::optional<mx::array>& history,
                                            const std::optional<mx::array>& key = std::nullopt);

// Throws when the sampled token's log-probability is NaN or infinite: the model's logits held
// NaN or +inf (or everything was masked), and what was sampled means nothing. Reads the evaluated
// (V,) log-probabilities on the host, so it queues no work behind the step in flight.
void check_sampled(const mx::array& logprobs, int token);

// mlx-lm's maybe_quantize_kv_cache: with kv_bits set, every cache that has a quantized form and
// holds >= quantized_kv_start tokens is replaced by it. A layer listed in kv_config is instead
// quantized at its own bits once its cache holds a token. Sliding-window caches become
// RotatingQuantizedKVCache (where mlx-lm raises NotImplementedError).
void maybe_quantize_kv_cache(Cache& cache, const GenerateOptions& options);

// Adds the cache's allocated bytes and what one more cached token costs to the stats.
void add_kv_stats(GenerationStats& stats, const Cache& cache);

// Streams tokens to `on_token` until max_tokens, an EOS id, or on_token returning false.
GenerationStats generate(Model& model, const std::vector<int>& prompt,
                         const GenerateOptions& options, const std::vector<int>& eos_ids,
                         const std::function<bool(const Step&)>& on_token);
// The same continuing from `cache`, which already holds the context before `prompt`.
GenerationStats generate(Model& model, Cache& cache, const std::vector<int>& prompt,
                         const GenerateOptions& options, const std::vector<int>& eos_ids,
                         const std::function<bool(const Step&)>& on_token);

}  // namespace lmx
