// A batch of independent rows seen as one layer's cache by a batched forward (the scheduler's
// decode steps). The dense work (projections, norms, MLP, head) runs once over (B, L, ...);
// RoPE positions, masks and attention stay per row, each on the row's own cache of any type
// (plain, rotating, quantized, rotating-quantized), so a row computes what it computes alone.
#pragma once

#include <vector>

#include "cache/kv_cache.h"

namespace lmx {

class RowsKVCache : public KVCacheBase {
 public:
  // rows[b]: row b's cache of this layer, owned by the row and outliving this view.
  // cpu_kernels: the model runs tier L3 on the CPU, so decode attention over plain caches may
  // take lmx's rows kernel (nn::cached_attention).
  explicit RowsKVCache(std::vector<KVCacheBase*> rows, bool cpu_kernels = false);
  bool cpu_kernels() const { return cpu_kernels_; }

  int size() const { return static_cast<int>(rows_.size()); }
  KVCacheBase& row(int b) const { return *rows_[b]; }
  // Each row's position before this forward, (B,) int32: the RoPE offsets.
  mx::array offsets() const;

  // A row view has no single K/V tensor or offset: cached_attention and RoPE ask for the rows.
  std::pair<mx::array, mx::array> update_and_fetch(const mx::array& keys,
                                                   const mx::array& values) override;
  int offset() const override;
  bool is_trimmable() const override { return false; }
  int trim(int n, bool bypass = false) override;
  // Each row's own mask in Mask::rows.
  Mask make_mask(int n, std::optional<int> window = std::nullopt,
                 bool return_array = false) const override;
  std::vector<mx::array> state() const override;
  size_t nbytes() const override;

 private:
  std::vector<KVCacheBase*> rows_;
  bool cpu_kernels_;
};

// The RoPE positions of a forward over `cache`: its offset, or each row's for a row view.
std::vector<int> rope_offsets(const KVCacheBase& cache);

// The batched view of B rows' caches (each a whole model's Cache): one RowsKVCache per layer.
Cache rows_view(const std::vector<Cache*>& rows, bool cpu_kernels = false);

}  // namespace lmx
