// The prompt cache of the scheduler (engine/scheduler.cpp): KV caches of earlier requests keyed
// by model and adapter, reused for the longest common token prefix of a new prompt; least
// recently used entries are evicted past an entry count or a byte cap.
#pragma once

#include <cstddef>
#include <list>
#include <optional>
#include <string>
#include <vector>

#include "cache/kv_cache.h"

namespace lmx {

struct CacheHit {
  Cache cache;  // trimmed to hold exactly `reused` tokens
  size_t reused = 0;
};

class PromptCacheLRU {
 public:
  PromptCacheLRU(size_t max_entries, std::optional<size_t> max_bytes)
      : max_entries_(max_entries), max_bytes_(max_bytes) {}

  // Takes out the entry of `key` sharing the longest prefix with `prompt`, trimmed to that prefix.
  // At most prompt.size() - 1 tokens are reused: the last prompt token must run to give logits.
  std::optional<CacheHit> take(const std::string& key, const std::vector<int>& prompt);
  // `tokens` are the tokens whose K/V the cache holds, in order (it may hold more past them:
  // take() trims by the cache's offset).
  void put(const std::string& key, std::vector<int> tokens, Cache cache);

  size_t entries() const { return entries_.size(); }
  size_t bytes() const;

 private:
  struct Entry {
    std::string key;
    std::vector<int> tokens;
    Cache cache;
    size_t bytes;
  };
  std::list<Entry> entries_;  // front: most recently used
  size_t max_entries_;
  std::optional<size_t> max_bytes_;
};

size_t cache_bytes(const Cache& cache);

}  // namespace lmx
