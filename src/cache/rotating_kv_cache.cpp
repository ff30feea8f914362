#include "cache/rotating_kv_cache.h"

#include <algorithm>
#include <functional>

#include "cache/rotating_quantized_kv_cache.h"
#include "core/error.h"

namespace lmx {

namespace {

using Parts = std::vector<mx::array>;

Parts each(const Parts& parts, const std::function<mx::array(const mx::array&)>& f) {
  Parts out;
  out.reserve(parts.size());
  for (const mx::array& a : parts) out.push_back(f(a));
  return out;
}

}  // namespace

RotatingCacheBase::RotatingCacheBase(int max_size, int keep, const char* where)
    : where_(where), keep_(keep), max_size_(max_size) {
  check(max_size > 0, where, "max_size must be > 0, got ", max_size);
  check(keep >= 0 && keep < max_size, where, "keep must be in [0, max_size), got ", keep,
        " with max_size ", max_size);
}

// Drops trim_size of the oldest non-keep rows (buffer in temporal order), then appends.
mx::array RotatingCacheBase::trim_rows(int trim_size, const mx::array& v,
                                       const std::optional<mx::array>& append) const {
  std::vector<mx::array> parts;
  if (trim_size > 0) {
    parts = {seq_slice(v, 0, keep_), seq_slice(v, trim_size + keep_, v.shape(2))};
  } else {
    parts = {v};
  }
  if (append) parts.push_back(*append);
  return mx::concatenate(parts, 2);
}

// The ring rearranged into temporal order, the unused tail sliced off.
mx::array RotatingCacheBase::temporal_order(const mx::array& v) const {
  if (idx_ == v.shape(2)) return v;
  if (idx_ < offset_) {
    return mx::concatenate(
        {seq_slice(v, 0, keep_), seq_slice(v, idx_, v.shape(2)), seq_slice(v, keep_, idx_)}, 2);
  }
  return seq_slice(v, 0, idx_);
}

Parts RotatingCacheBase::update_concat(const Parts& rows) {
  if (data_.empty()) {
    data_ = rows;
  } else {
    data_ = each(data_, [&](const mx::array& v) { return temporal_order(v); });
    idx_ = data_[0].shape(2);
    // At most max_size + L - 1 rows, so every new token sees max_size keys of context.
    const int trim_size = idx_ - max_size_ + 1;
    for (size_t i = 0; i < data_.size(); ++i) data_[i] = trim_rows(trim_size, data_[i], rows[i]);
  }
  offset_ += rows[0].shape(2);
  idx_ = data_[0].shape(2);
  rollback_ = rows[0].shape(2);
  shared_ = true;
  return data_;
}

void RotatingCacheBase::make_room(int B, int H,
                                  const std::vector<std::pair<int, mx::Dtype>>& tails) {
  const int prev = offset_;
  // Grow in steps until max_size.
  if (data_.empty() || (prev >= data_[0].shape(2) && data_[0].shape(2) < max_size_)) {
    const int new_size = std::min(kStep, max_size_ - prev);
    Parts grown;
    for (size_t i = 0; i < tails.size(); ++i) {
      mx::array zeros = mx::zeros({B, H, new_size, tails[i].first}, tails[i].second);
      grown.push_back(data_.empty() ? zeros : mx::concatenate({data_[i], zeros}, 2));
    }
    data_ = std::move(grown);
    idx_ = prev;
    shared_ = false;  // new buffers
  }
  // A multi-token write may have left more than max_size rows.
  const int trim_size = data_[0].shape(2) - max_size_;
  if (trim_size > 0) {
    data_ = each(data_, [&](const mx::array& v) { return trim_rows(trim_size, v); });
    idx_ = max_size_;
    shared_ = false;
  }
  if (idx_ == max_size_) idx_ = keep_;  // rotate
}

Parts RotatingCacheBase::update_in_place(const Parts& rows) {
  const int B = rows[0].shape(0), H = rows[0].shape(1), S = rows[0].shape(2);
  std::vector<std::pair<int, mx::Dtype>> tails;
  for (const mx::array& r : rows) tails.emplace_back(r.shape(3), r.dtype());
  make_room(B, H, tails);
  for (size_t i = 0; i < data_.size(); ++i) data_[i] = seq_assign(data_[i], rows[i], idx_);
  offset_ += S;
  idx_ += S;
  rollback_ = 0;
  shared_ = true;  // active() hands out the buffers or views of them
  return active();
}

RotatingCacheBase::RingSlots RotatingCacheBase::ring_reserve(
    int B, int H, int L, std::vector<std::pair<int, mx::Dtype>> tails) {
  check(L > 0 && tails.size() == (data_.empty() ? tails.size() : data_.size()), where_,
        "ring_reserve: expected L > 0 and one tail per stored part, got L = ", L, ", ",
        tails.size(), " tails");
  // A ring keeps the dtype its rows have (written by update_and_fetch or loaded).
  for (size_t i = 0; i < data_.size(); ++i) tails[i] = {data_[i].shape(3), data_[i].dtype()};
  RingSlots s;
  if (L == 1) {
    make_room(B, H, tails);
    s.pos = idx_;
    s.rows = std::min(offset_ + 1, data_[0].shape(2));
    s.in_place = !shared_;
  } else {
    // update_concat with L rows of zeros for the writer to fill.
    Parts zeros;
    for (const auto& [d, dtype] : tails) zeros.push_back(mx::zeros({B, H, L, d}, dtype));
    if (data_.empty()) {
      data_ = std::move(zeros);
    } else {
      data_ = each(data_, [&](const mx::array& v) { return temporal_order(v); });
      idx_ = data_[0].shape(2);
      const int trim_size = idx_ - max_size_ + 1;
      for (size_t i = 0; i < data_.size(); ++i) data_[i] = trim_rows(trim_size, data_[i], zeros[i]);
    }
    s.rows = data_[0].shape(2);
    s.pos = s.rows - L;
    s.in_place = true;  // a new concatenation (or new zeros)
  }
  s.parts = std::move(data_);
  data_.clear();
  return s;
}

void RotatingCacheBase::ring_commit(Parts parts, int L) {
  data_ = std::move(parts);
  offset_ += L;
  if (L == 1) {
    ++idx_;
    rollback_ = 0;
  } else {
    idx_ = data_[0].shape(2);
    rollback_ = L;
  }
  shared_ = false;  // written in place or copied: the cache's own
}

Parts RotatingCacheBase::ring_update(const Parts& rows) {
  if (rows[0].shape(2) == 1) return update_in_place(rows);
  return update_concat(rows);
}

Parts RotatingCacheBase::active() const {
  if (offset_ < data_[0].shape(2))
    return each(data_, [&](const mx::array& v) { return seq_slice(v, 0, offset_); });
  return data_;
}

int RotatingCacheBase::trim(int n, bool bypass) {
  n = std::min(offset_, n);
  if (n <= 0) return 0;
  if (!bypass) {
    offset_ -= n;
    idx_ -= n;
    rollback_ = 0;  // the buffer now holds rows past idx
    return n;
  }
  // Keeping a row of that write keeps the buffer what a cache given only those rows holds.
  check(n < rollback_, where_, "trim(", n, ", bypass) drops rows of the last multi-token write ",
        "and keeps at least one, expected n < ", rollback_, " (that write's rows still cached)");
  const int size = data_[0].shape(2) - n;
  data_ = each(data_, [&](const mx::array& v) { return seq_slice(v, 0, size); });
  shared_ = true;  // views of the old buffers
  offset_ -= n;
  idx_ = size;
  rollback_ -= n;
  return n;
}

Mask RotatingCacheBase::make_mask(int n, std::optional<int> window, bool return_array) const {
  if (n > 1) {
    const int w = window && *window ? *window : max_size_;
    const int off = std::min(max_size_ - 1, offset_);
    if (off + n > w || return_array) return {"", create_causal_mask(n, off, w)};
    return {"causal", std::nullopt};
  }
  if (!window) return {};
  // A window narrower than the ring: a (mask_size,) vector rolled to the ring position.
  if (offset_ >= *window && max_size_ > *window) {
    const int idx = idx_ >= max_size_ ? 0 : idx_;
    const int mask_size = offset_ < max_size_ ? offset_ + 1 : max_size_;
    mx::array mask = mx::greater_equal(mx::arange(mask_size), mx::array(mask_size - *window));
    return {"", mx::roll(mask, idx + 1)};
  }
  return {};
}

std::vector<mx::array> RotatingCacheBase::state() const {
  shared_ = true;
  return data_;
}

size_t RotatingCacheBase::nbytes() const {
  size_t n = 0;
  for (const mx::array& a : data_) n += a.nbytes();
  return n;
}

void RotatingCacheBase::set_ring(Parts data, int offset, int idx, int rollback) {
  data_ = std::move(data);
  offset_ = offset;
  idx_ = idx;
  rollback_ = rollback;
  shared_ = true;
}

RotatingKVCache::RotatingKVCache(int max_size, int keep)
    : RotatingCacheBase(max_size, keep, "RotatingKVCache") {}

std::pair<mx::array, mx::array> RotatingKVCache::update_and_fetch(const mx::array& keys,
                                                                  const mx::array& values) {
  Parts kv = ring_update({keys, values});
  return {kv[0], kv[1]};
}

void RotatingKVCache::set_state(std::optional<mx::array> keys, std::optional<mx::array> values,
                                int offset, int idx) {
  Parts data;
  if (keys && values) data = {*keys, *values};
  set_ring(std::move(data), offset, idx);
}

std::unique_ptr<KVCacheBase> RotatingKVCache::to_quantized(int group_size, int bits) const {
  auto q = std::make_unique<RotatingQuantizedKVCache>(max_size(), keep(), group_size, bits);
  std::optional<QuantizedArray> k, v;
  if (!data().empty()) {
    k = quantize_kv(data()[0], group_size, bits);
    v = quantize_kv(data()[1], group_size, bits);
  }
  q->set_state(std::move(k), std::move(v), offset(), idx(), rollback_rows());
  return q;
}

}  // namespace lmx
