#include "cache/rows_cache.h"

#include "core/error.h"

namespace lmx {

RowsKVCache::RowsKVCache(std::vector<KVCacheBase*> rows, bool cpu_kernels)
    : rows_(std::move(rows)), cpu_kernels_(cpu_kernels) {
  check(!rows_.empty(), "batch", "a row view needs at least one row");
}

mx::array RowsKVCache::offsets() const {
  const std::vector<int> o = rope_offsets(*this);
  return mx::array(o.data(), {static_cast<int>(o.size())}, mx::int32);
}

std::vector<int> rope_offsets(const KVCacheBase& cache) {
  const auto* rows = dynamic_cast<const RowsKVCache*>(&cache);
  if (!rows) return {cache.offset()};
  std::vector<int> o;
  o.reserve(rows->size());
  for (int b = 0; b < rows->size(); ++b) o.push_back(rows->row(b).offset());
  return o;
}

std::pair<mx::array, mx::array> RowsKVCache::update_and_fetch(const mx::array&, const mx::array&) {
  fail("batch", "a row view has no joint K/V; attention must run per row (nn::cached_attention)");
}

int RowsKVCache::offset() const {
  fail("batch", "a row view has one offset per row, expected a caller of offsets()");
}

int RowsKVCache::trim(int, bool) { fail("batch", "trim a row's own cache, not the row view"); }

Mask RowsKVCache::make_mask(int n, std::optional<int> window, bool return_array) const {
  Mask m;
  m.rows.reserve(rows_.size());
  for (const auto* r : rows_) m.rows.push_back(r->make_mask(n, window, return_array));
  return m;
}

std::vector<mx::array> RowsKVCache::state() const {
  std::vector<mx::array> out;
  for (const auto* r : rows_)
    for (auto& a : r->state()) out.push_back(a);
  return out;
}

size_t RowsKVCache::nbytes() const {
  size_t n = 0;
  for (const auto* r : rows_) n += r->nbytes();
  return n;
}

Cache rows_view(const std::vector<Cache*>& rows, bool cpu_kernels) {
  check(!rows.empty(), "batch", "a row view needs at least one row");
  const size_t layers = rows.front()->size();
  Cache view;
  view.reserve(layers);
  for (size_t l = 0; l < layers; ++l) {
    std::vector<KVCacheBase*> layer;
    layer.reserve(rows.size());
    for (Cache* c : rows) {
      check(c->size() == layers, "batch", "rows of one model, expected ", layers,
            " layer caches, got ", c->size());
      layer.push_back((*c)[l].get());
    }
    view.push_back(std::make_unique<RowsKVCache>(std::move(layer), cpu_kernels));
  }
  return view;
}

}  // namespace lmx
