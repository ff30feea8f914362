#include "cache/arrays_cache.h"

#include "core/error.h"

namespace lmx {

std::pair<mx::array, mx::array> ArraysCache::update_and_fetch(const mx::array&, const mx::array&) {
  fail("ArraysCache", "update_and_fetch called on a linear-attention state, expected a KV cache");
}

int ArraysCache::trim(int n, bool) {
  check(n <= 0, "ArraysCache", "cannot trim ", n,
        " tokens: the linear-attention (gated DeltaNet) state of ", offset_,
        " tokens is not trimmable, expected trim(0)");
  return 0;
}

Mask ArraysCache::make_mask(int, std::optional<int>, bool) const { return {}; }

std::vector<mx::array> ArraysCache::state() const {
  std::vector<mx::array> out;
  for (const auto& a : arrays_)
    if (a) out.push_back(*a);
  return out;
}

size_t ArraysCache::nbytes() const {
  size_t n = 0;
  for (const auto& a : arrays_)
    if (a) n += a->nbytes();
  return n;
}

void ArraysCache::set_state(std::optional<mx::array> conv, std::optional<mx::array> recurrent,
                            int offset) {
  arrays_[0] = std::move(conv);
  arrays_[1] = std::move(recurrent);
  offset_ = offset;
}

}  // namespace lmx
