// mlx-lm's save_prompt_cache / load_prompt_cache (models/cache.py): every cache's `state` in one
// safetensors file under "<layer>.<item>[.<part>]" (scalars as 0-d int32 arrays, None as an empty
// array), and in the metadata the user's entries ("0.<key>"), the class names ("1.<layer>") and
// the list of scalar / none entries ("2.<n>.0" = array key, "2.<n>.1" = "scalar" or "none").
// Files written by either side load in the other.
#pragma once

#include <filesystem>

#include "cache/kv_cache.h"
#include "io/safetensors.h"

namespace lmx {

// KVCache, RotatingKVCache, QuantizedKVCache, RotatingQuantizedKVCache and ArraysCache (whose
// token count, which mlx-lm does not save, is taken on load from the model's first attention
// cache); other cache types are an error.
void save_prompt_cache(const std::filesystem::path& file, const Cache& cache,
                       const Metadata& metadata = {});

struct PromptCache {
  Cache cache;
  Metadata metadata;  // the user's entries
};

PromptCache load_prompt_cache(const std::filesystem::path& file);

}  // namespace lmx
