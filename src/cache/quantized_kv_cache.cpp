#include "cache/quantized_kv_cache.h"

#include <functional>

#include "core/error.h"

namespace lmx {

namespace {

constexpr const char* kWhere = "QuantizedKVCache";

// The three arrays of a triple, in mlx-lm's tuple order.
std::vector<mx::array*> parts(QuantizedArray& q) { return {&q.packed, &q.scales, &q.biases}; }
std::vector<const mx::array*> parts(const QuantizedArray& q) {
  return {&q.packed, &q.scales, &q.biases};
}

QuantizedArray map(const QuantizedArray& q, const std::function<mx::array(const mx::array&)>& f) {
  return {f(q.packed), f(q.scales), f(q.biases)};
}

}  // namespace

QuantizedArray quantize_kv(const mx::array& x, int group_size, int bits) {
  check(x.shape(-1) % group_size == 0, kWhere, "head_dim ", x.shape(-1),
        " is not divisible by the KV group size, expected a multiple of ", group_size);
  std::vector<mx::array> q = mx::quantize(x, group_size, bits);
  return {q[0], q[1], q[2]};
}

QuantizedKVCache::QuantizedKVCache(int group_size, int bits)
    : group_size_(group_size), bits_(bits) {
  validate(group_size, bits);
}

void QuantizedKVCache::validate(int group_size, int bits) {
  check(bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8, kWhere,
        "unsupported KV bits ", bits, ", expected one of 2, 3, 4, 5, 6, 8");
  check(group_size == 32 || group_size == 64 || group_size == 128, kWhere,
        "unsupported KV group size ", group_size, ", expected 32, 64 or 128");
}

std::pair<mx::array, mx::array> QuantizedKVCache::update_and_fetch(const mx::array&,
                                                                   const mx::array&) {
  fail(kWhere, "keys and values are stored quantized, expected update_and_fetch_quantized");
}

std::pair<QuantizedArray, QuantizedArray> QuantizedKVCache::update_and_fetch_quantized(
    const mx::array& keys, const mx::array& values) {
  const int B = keys.shape(0), H = keys.shape(1), S = keys.shape(2);
  const int prev = offset_;
  if (!keys_ || prev + S > keys_->packed.shape(2)) {
    const int el_per_int = 32 / bits_;
    const int new_steps = (kStep + S - 1) / kStep * kStep;
    auto init = [&](int dim) {
      return QuantizedArray{mx::zeros({B, H, new_steps, dim / el_per_int}, mx::uint32),
                            mx::zeros({B, H, new_steps, dim / group_size_}, keys.dtype()),
                            mx::zeros({B, H, new_steps, dim / group_size_}, keys.dtype())};
    };
    auto expand = [&](const mx::array& x) {
      return mx::concatenate({x, mx::zeros({B, H, new_steps, x.shape(-1)}, x.dtype())}, 2);
    };
    if (keys_) {
      if (prev % kStep != 0) {
        auto cut = [&](const mx::array& x) { return seq_slice(x, 0, prev); };
        keys_ = map(*keys_, cut);
        values_ = map(*values_, cut);
      }
      keys_ = map(*keys_, expand);
      values_ = map(*values_, expand);
    } else {
      keys_ = init(keys.shape(3));
      values_ = init(values.shape(3));
    }
  }
  offset_ += S;
  const QuantizedArray qk = quantize_kv(keys, group_size_, bits_);
  const QuantizedArray qv = quantize_kv(values, group_size_, bits_);
  auto dst_k = parts(*keys_), dst_v = parts(*values_);
  auto src_k = parts(qk), src_v = parts(qv);
  for (size_t i = 0; i < dst_k.size(); ++i) {
    *dst_k[i] = seq_assign(*dst_k[i], *src_k[i], prev);
    *dst_v[i] = seq_assign(*dst_v[i], *src_v[i], prev);
  }
  if (offset_ == keys_->packed.shape(2)) return {*keys_, *values_};
  auto head = [&](const mx::array& x) { return seq_slice(x, 0, offset_); };
  return {map(*keys_, head), map(*values_, head)};
}

int QuantizedKVCache::trim(int n, bool) {
  n = std::min(offset_, n);
  offset_ -= n;
  return n;
}

Mask QuantizedKVCache::make_mask(int n, std::optional<int> window, bool return_array) const {
  return create_attention_mask(n, offset_, return_array, window);
}

std::vector<mx::array> QuantizedKVCache::state() const {
  if (!keys_) return {};
  std::vector<mx::array> out;
  for (const QuantizedArray* q : {&*keys_, &*values_})
    for (const mx::array* a : parts(*q)) out.push_back(*a);
  return out;
}

size_t QuantizedKVCache::nbytes() const {
  size_t n = 0;
  for (const mx::array& a : state()) n += a.nbytes();
  return n;
}

void QuantizedKVCache::set_state(std::optional<QuantizedArray> keys,
                                 std::optional<QuantizedArray> values, int offset) {
  keys_ = std::move(keys);
  values_ = std::move(values);
  offset_ = offset;
}

}  // namespace lmx
