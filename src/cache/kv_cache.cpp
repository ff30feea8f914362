#include "cache/kv_cache.h"

#include "cache/quantized_kv_cache.h"
#include "core/error.h"

namespace lmx {

mx::array create_causal_mask(int n, int offset, std::optional<int> window) {
  mx::array rinds = mx::arange(offset + n);
  mx::array linds = offset ? mx::arange(offset, offset + n) : rinds;
  linds = mx::expand_dims(linds, 1);
  rinds = mx::expand_dims(rinds, 0);
  mx::array mask = mx::greater_equal(linds, rinds);
  if (window) mask = mx::logical_and(mask, mx::less(linds, mx::add(rinds, mx::array(*window))));
  return mask;
}

Mask create_attention_mask(int n, int offset, bool return_array, std::optional<int> window) {
  if (window) return {"", create_causal_mask(n, offset, window)};
  if (n == 1) return {};
  if (return_array) return {"", create_causal_mask(n, offset, window)};
  return {"causal", std::nullopt};
}

void KVCache::grow(int B, int H, int Dk, int Dv, mx::Dtype dtype, int L) {
  const int prev = offset_;
  if (keys_ && prev + L <= keys_->shape(2)) return;
  const int n_steps = (kStep + L - 1) / kStep;
  mx::array new_k = mx::zeros({B, H, n_steps * kStep, Dk}, dtype);
  mx::array new_v = mx::zeros({B, H, n_steps * kStep, Dv}, dtype);
  if (keys_) {
    if (prev % kStep != 0) {
      keys_ = mx::slice(*keys_, {0, 0, 0, 0}, {B, H, prev, Dk});
      values_ = mx::slice(*values_, {0, 0, 0, 0}, {B, H, prev, Dv});
    }
    keys_ = mx::concatenate({*keys_, new_k}, 2);
    values_ = mx::concatenate({*values_, new_v}, 2);
  } else {
    keys_ = new_k;
    values_ = new_v;
  }
  shared_ = false;  // new buffers
}

KVCache::Buffers KVCache::reserve(int B, int H, int Dk, int Dv, mx::Dtype dtype, int L) {
  grow(B, H, Dk, Dv, dtype, L);
  Buffers out{*keys_, *values_, !shared_};
  keys_.reset();  // the writer's until commit
  values_.reset();
  return out;
}

void KVCache::commit(mx::array keys, mx::array values, int L) {
  keys_ = std::move(keys);
  values_ = std::move(values);
  offset_ += L;
  shared_ = false;  // written in place or copied: the cache's own
}

std::pair<mx::array, mx::array> KVCache::update_and_fetch(const mx::array& keys,
                                                          const mx::array& values) {
  const int prev = offset_;
  const int L = keys.shape(2);
  grow(keys.shape(0), keys.shape(1), keys.shape(3), values.shape(3), keys.dtype(), L);
  shared_ = true;  // the views returned below
  offset_ += L;
  const auto& ks = keys_->shape();
  const auto& vs = values_->shape();
  keys_ = mx::slice_update(*keys_, keys, mx::Shape{0, 0, prev, 0},
                           mx::Shape{ks[0], ks[1], offset_, ks[3]});
  values_ = mx::slice_update(*values_, values, mx::Shape{0, 0, prev, 0},
                             mx::Shape{vs[0], vs[1], offset_, vs[3]});
  if (offset_ < keys_->shape(2)) {
    return {mx::slice(*keys_, {0, 0, 0, 0}, {ks[0], ks[1], offset_, ks[3]}),
            mx::slice(*values_, {0, 0, 0, 0}, {vs[0], vs[1], offset_, vs[3]})};
  }
  return {*keys_, *values_};
}

int KVCache::trim(int n, bool) {
  n = std::min(offset_, n);
  offset_ -= n;
  return n;
}

Mask KVCache::make_mask(int n, std::optional<int> window, bool return_array) const {
  return create_attention_mask(n, offset_, return_array, window);
}

std::vector<mx::array> KVCache::state() const {
  if (!keys_) return {};
  shared_ = true;
  return {*keys_, *values_};
}

size_t KVCache::nbytes() const { return keys_ ? keys_->nbytes() + values_->nbytes() : 0; }

void KVCache::set_state(std::optional<mx::array> keys, std::optional<mx::array> values,
                        int offset) {
  keys_ = std::move(keys);
  values_ = std::move(values);
  offset_ = offset;
  shared_ = true;
}

std::unique_ptr<KVCacheBase> KVCache::to_quantized(int group_size, int bits) const {
  auto q = std::make_unique<QuantizedKVCache>(group_size, bits);
  shared_ = true;  // the quantized arrays are computed from the buffers later
  if (keys_) {
    q->set_state(quantize_kv(*keys_, group_size, bits), quantize_kv(*values_, group_size, bits),
                 offset_);
  } else {
    q->set_state(std::nullopt, std::nullopt, offset_);
  }
  return q;
}

std::pair<QuantizedArray, QuantizedArray> KVCacheBase::update_and_fetch_quantized(
    const mx::array&, const mx::array&) {
  fail("KV cache", "update_and_fetch_quantized called on a cache that stores K/V unquantized");
}

mx::array seq_slice(const mx::array& v, int start, int stop) {
  mx::Shape lo(v.ndim(), 0), hi = v.shape();
  lo[2] = start;
  hi[2] = stop;
  return mx::slice(v, lo, hi);
}

mx::array seq_assign(const mx::array& v, const mx::array& rows, int start) {
  mx::Shape lo(v.ndim(), 0), hi = v.shape();
  lo[2] = start;
  hi[2] = start + rows.shape(2);
  return mx::slice_update(v, rows, lo, hi);
}

}  // namespace lmx
