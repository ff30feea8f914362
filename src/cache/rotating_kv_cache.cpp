#include "cache/rotating_kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace lmx {

namespace {
constexpr const char* kWhere = "RotatingKVCache";
}  // namespace

RotatingKVCache::RotatingKVCache(int max_size, int keep) : keep_(keep), max_size_(max_size) {
  check(max_size > 0, kWhere, "max_size must be > 0, got ", max_size);
  check(keep >= 0 && keep < max_size, kWhere, "keep must be in [0, max_size), got ", keep,
        " with max_size ", max_size);
}

// Drops trim_size of the oldest non-keep rows (buffer in temporal order), then appends.
mx::array RotatingKVCache::trim_rows(int trim_size, const mx::array& v,
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
mx::array RotatingKVCache::temporal_order(const mx::array& v) const {
  if (idx_ == v.shape(2)) return v;
  if (idx_ < offset_) {
    return mx::concatenate(
        {seq_slice(v, 0, keep_), seq_slice(v, idx_, v.shape(2)), seq_slice(v, keep_, idx_)}, 2);
  }
  return seq_slice(v, 0, idx_);
}

std::pair<mx::array, mx::array> RotatingKVCache::update_concat(const mx::array& keys,
                                                               const mx::array& values) {
  if (!keys_) {
    keys_ = keys;
    values_ = values;
  } else {
    keys_ = temporal_order(*keys_);
    values_ = temporal_order(*values_);
    idx_ = keys_->shape(2);
    // At most max_size + L - 1 rows, so every new token sees max_size keys of context.
    const int trim_size = idx_ - max_size_ + 1;
    keys_ = trim_rows(trim_size, *keys_, keys);
    values_ = trim_rows(trim_size, *values_, values);
  }
  offset_ += keys.shape(2);
  idx_ = keys_->shape(2);
  return {*keys_, *values_};
}

std::pair<mx::array, mx::array> RotatingKVCache::update_in_place(const mx::array& keys,
                                                                 const mx::array& values) {
  const int B = keys.shape(0), H = keys.shape(1), S = keys.shape(2);
  const int prev = offset_;
  // Grow in steps until max_size.
  if (!keys_ || (prev >= keys_->shape(2) && keys_->shape(2) < max_size_)) {
    const int new_size = std::min(kStep, max_size_ - prev);
    mx::array new_k = mx::zeros({B, H, new_size, keys.shape(3)}, keys.dtype());
    mx::array new_v = mx::zeros({B, H, new_size, values.shape(3)}, values.dtype());
    if (keys_) {
      keys_ = mx::concatenate({*keys_, new_k}, 2);
      values_ = mx::concatenate({*values_, new_v}, 2);
    } else {
      keys_ = new_k;
      values_ = new_v;
    }
    idx_ = prev;
  }
  // A multi-token write may have left more than max_size rows.
  const int trim_size = keys_->shape(2) - max_size_;
  if (trim_size > 0) {
    keys_ = trim_rows(trim_size, *keys_);
    values_ = trim_rows(trim_size, *values_);
    idx_ = max_size_;
  }
  if (idx_ == max_size_) idx_ = keep_;  // rotate
  keys_ = seq_assign(*keys_, keys, idx_);
  values_ = seq_assign(*values_, values, idx_);
  offset_ += S;
  idx_ += S;
  return keys_and_values();
}

std::pair<mx::array, mx::array> RotatingKVCache::update_and_fetch(const mx::array& keys,
                                                                  const mx::array& values) {
  if (keys.shape(2) == 1) return update_in_place(keys, values);
  return update_concat(keys, values);
}

std::pair<mx::array, mx::array> RotatingKVCache::keys_and_values() const {
  if (offset_ < keys_->shape(2))
    return {seq_slice(*keys_, 0, offset_), seq_slice(*values_, 0, offset_)};
  return {*keys_, *values_};
}

int RotatingKVCache::trim(int n) {
  n = std::min(offset_, n);
  offset_ -= n;
  idx_ -= n;
  return n;
}

Mask RotatingKVCache::make_mask(int n, std::optional<int> window, bool return_array) const {
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

std::vector<mx::array> RotatingKVCache::state() const {
  if (!keys_) return {};
  return {*keys_, *values_};
}

size_t RotatingKVCache::nbytes() const { return keys_ ? keys_->nbytes() + values_->nbytes() : 0; }

void RotatingKVCache::set_state(std::optional<mx::array> keys, std::optional<mx::array> values,
                                int offset, int idx) {
  keys_ = std::move(keys);
  values_ = std::move(values);
  offset_ = offset;
  idx_ = idx;
}

std::unique_ptr<KVCacheBase> RotatingKVCache::to_quantized(int, int) const {
  fail(kWhere,
       "KV quantization of a sliding-window cache is not implemented (mlx-lm raises "
       "NotImplementedError too), expected --kv-bits unset or --quantized-kv-start above "
       "the context length");
}

}  // namespace lmx
