// mlx-lm's sampler and logits processors (sample_utils.py), same order and numerics.
#pragma once

#include <mlx/mlx.h>

#include <optional>
#include <vector>

#include "lmx/lmx.h"

namespace lmx {

namespace mx = mlx::core;

// Validates options; throws lmx::Error naming the bad field.
void validate(const SamplerOptions& o, int vocab_size);
void validate(const LogitsProcessorOptions& o);

// logprobs: (B, V) -> sampled ids (B,). Draws with `key`, else MLX's global random state
// (seeded by the caller).
mx::array sample(const mx::array& logprobs, const SamplerOptions& o,
                 const std::optional<mx::array>& key = std::nullopt);

// The distribution sample() draws from, (B, V) float32: one-hot at the argmax for temp 0, else
// softmax of the filtered logprobs over temp (what rejection sampling compares).
mx::array sampling_distribution(const mx::array& logprobs, const SamplerOptions& o);

mx::array apply_top_p(const mx::array& logprobs, float top_p);
mx::array apply_min_p(const mx::array& logprobs, float min_p, int min_tokens_to_keep);
mx::array apply_top_k(const mx::array& logprobs, int top_k);

// tokens: every token so far (prompt and generated), int32 (N,); logits (B, V).
mx::array process_logits(const mx::array& tokens, mx::array logits,
                         const LogitsProcessorOptions& o);

}  // namespace lmx
