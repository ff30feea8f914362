#include "cache/prompt_cache_lru.h"

#include <algorithm>

namespace lmx {

size_t cache_bytes(const Cache& cache) {
  size_t n = 0;
  for (const auto& c : cache) n += c->nbytes();
  return n;
}

size_t PromptCacheLRU::bytes() const {
  size_t n = 0;
  for (const auto& e : entries_) n += e.bytes;
  return n;
}

std::optional<CacheHit> PromptCacheLRU::take(const std::string& key,
                                             const std::vector<int>& prompt) {
  auto best = entries_.end();
  size_t best_len = 0;
  const size_t limit = prompt.empty() ? 0 : prompt.size() - 1;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->key != key) continue;
    const size_t n = std::min(limit, it->tokens.size());
    size_t common = 0;
    while (common < n && it->tokens[common] == prompt[common]) ++common;
    if (common == 0 || common <= best_len) continue;
    // A cache that cannot drop its tail (a rotating window that wrapped) is only usable whole.
    bool trimmable = true, longer = false;
    for (const auto& c : it->cache) {
      trimmable = trimmable && c->is_trimmable();
      longer = longer || c->offset() > static_cast<int>(common);
    }
    if (longer && !trimmable) continue;
    best = it;
    best_len = common;
  }
  if (best == entries_.end()) return std::nullopt;
  CacheHit hit{std::move(best->cache), best_len};
  entries_.erase(best);
  // By each cache's own offset: it may hold a token past `tokens` (a step queued ahead of the
  // last token read, e.g. an EOS that was fed before it was seen).
  for (auto& c : hit.cache) {
    const int drop = c->offset() - static_cast<int>(best_len);
    if (drop > 0) c->trim(drop);
  }
  return hit;
}

void PromptCacheLRU::put(const std::string& key, std::vector<int> tokens, Cache cache) {
  if (max_entries_ == 0 || tokens.empty()) return;
  const size_t b = cache_bytes(cache);
  if (max_bytes_ && b > *max_bytes_) return;
  entries_.push_front(Entry{key, std::move(tokens), std::move(cache), b});
  while (entries_.size() > max_entries_ || (max_bytes_ && bytes() > *max_bytes_))
    entries_.pop_back();
}

}  // namespace lmx
