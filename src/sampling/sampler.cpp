#include "sampling/sampler.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace lmx {

namespace {
constexpr float kInf = std::numeric_limits<float>::infinity();

// A Python scalar meeting an array is "weak": it takes the array's dtype.
mx::array weak(double v, const mx::array& like) {
  return mx::array(static_cast<float>(v), like.dtype());
}

// logits.at[:, cols].add(values) for (B, V) logits, cols and values (n,); duplicates accumulate.
mx::array add_at_columns(const mx::array& logits, const mx::array& cols, const mx::array& values) {
  const int B = logits.shape(0), n = cols.shape(0);
  mx::array rows = mx::broadcast_to(mx::reshape(mx::arange(B), {B, 1}), {B, n});
  mx::array c = mx::broadcast_to(mx::reshape(cols, {1, n}), {B, n});
  mx::array upd = mx::broadcast_to(mx::reshape(values, {1, n, 1, 1}), {B, n, 1, 1});
  return mx::scatter_add(logits, {rows, c}, upd, {0, 1});
}

mx::array last_n(const mx::array& tokens, int n) {
  const int len = tokens.shape(0);
  if (len <= n) return tokens;
  return mx::slice(tokens, {len - n}, {len});
}

}  // namespace

void validate(const SamplerOptions& o, int vocab_size) {
  check(o.temp >= 0 && std::isfinite(o.temp), "sampler", "temp must be >= 0, got ", o.temp);
  check(o.top_p >= 0 && o.top_p <= 1, "sampler", "top_p must be in [0, 1], got ", o.top_p);
  check(o.min_p >= 0 && o.min_p <= 1, "sampler", "min_p must be in [0, 1], got ", o.min_p);
  check(o.min_tokens_to_keep >= 1, "sampler", "min_tokens_to_keep must be >= 1, got ",
        o.min_tokens_to_keep);
  check(o.top_k >= 0 && (o.top_k == 0 || o.top_k < vocab_size), "sampler", "top_k must be in [0, ",
        vocab_size, "), got ", o.top_k);
}

void validate(const LogitsProcessorOptions& o) {
  check(!o.repetition_penalty || *o.repetition_penalty >= 0, "sampler",
        "repetition_penalty must be >= 0, got ", o.repetition_penalty.value_or(0));
  check(
      o.repetition_context_size > 0 && o.presence_context_size > 0 && o.frequency_context_size > 0,
      "sampler", "penalty context sizes must be > 0");
}

mx::array apply_top_p(const mx::array& logprobs, float top_p) {
  mx::array sorted = mx::sort(logprobs, -1);
  mx::array probs = mx::exp(mx::astype(sorted, mx::float32));
  mx::array mass_above = mx::cumsum(probs, -1, /*reverse=*/true, /*inclusive=*/false);
  mx::Shape start(logprobs.ndim(), 0), stop = logprobs.shape();
  stop.back() = 1;
  mx::array total = mx::add(mx::slice(mass_above, start, stop), mx::slice(probs, start, stop));
  mx::array dropped = mx::sum(mx::greater_equal(mass_above, mx::multiply(mx::array(top_p), total)),
                              -1, /*keepdims=*/true);
  mx::array threshold = mx::take_along_axis(sorted, dropped, -1);
  return mx::where(mx::less(logprobs, threshold), weak(-kInf, logprobs), logprobs);
}

mx::array apply_min_p(const mx::array& logprobs, float min_p, int min_tokens_to_keep) {
  mx::array top = mx::max(logprobs, -1, /*keepdims=*/true);
  mx::array scaled = mx::add(top, weak(std::log(min_p), top));
  mx::array remove = mx::less(logprobs, scaled);
  if (min_tokens_to_keep > 1) {
    mx::array idx = mx::argpartition(logprobs, -min_tokens_to_keep, -1);
    const int V = logprobs.shape(-1);
    mx::Shape start(logprobs.ndim(), 0);
    start.back() = V - min_tokens_to_keep;
    idx = mx::slice(idx, start, logprobs.shape());
    remove = mx::put_along_axis(remove, idx, mx::array(false), -1);
  }
  return mx::where(remove, weak(-kInf, logprobs), logprobs);
}

mx::array apply_top_k(const mx::array& logprobs, int top_k) {
  mx::array idx = mx::argpartition(mx::negative(logprobs), top_k - 1, -1);
  mx::Shape start(logprobs.ndim(), 0);
  start.back() = top_k;
  idx = mx::slice(idx, start, logprobs.shape());
  return mx::put_along_axis(logprobs, idx, mx::array(-kInf, logprobs.dtype()), -1);
}

namespace {
// The logits categorical sampling draws from: the filters, then logits * (1 / temp), the factor
// computed in double as Python does.
mx::array sampling_logits(const mx::array& logprobs, const SamplerOptions& o) {
  mx::array x = logprobs;
  if (o.top_p > 0 && o.top_p < 1) x = apply_top_p(x, o.top_p);
  if (o.min_p != 0) x = apply_min_p(x, o.min_p, o.min_tokens_to_keep);
  if (o.top_k > 0) x = apply_top_k(x, o.top_k);
  return mx::multiply(x, weak(1.0 / o.temp, x));
}
}  // namespace

mx::array sample(const mx::array& logprobs, const SamplerOptions& o,
                 const std::optional<mx::array>& key) {
  if (o.temp == 0) return mx::argmax(logprobs, -1);
  return mx::random::categorical(sampling_logits(logprobs, o), -1, key);
}

mx::array sampling_distribution(const mx::array& logprobs, const SamplerOptions& o) {
  if (o.temp == 0) {
    const int V = logprobs.shape(-1);
    mx::array top = mx::expand_dims(mx::argmax(logprobs, -1), -1);
    return mx::astype(mx::equal(mx::arange(V), top), mx::float32);
  }
  return mx::softmax(mx::astype(sampling_logits(logprobs, o), mx::float32), -1, /*precise=*/true);
}

mx::array process_logits(const mx::array& tokens, mx::array logits,
                         const LogitsProcessorOptions& o) {
  if (!o.logit_bias.empty()) {
    std::vector<int> ids;
    std::vector<float> vals;
    for (auto [id, v] : o.logit_bias) {
      ids.push_back(id);
      vals.push_back(v);
    }
    mx::array idx(ids.data(), {static_cast<int>(ids.size())}, mx::int32);
    mx::array val(vals.data(), {static_cast<int>(vals.size())}, mx::float32);
    // logits.at[:, indices].add(values)
    logits = add_at_columns(logits, idx, mx::astype(val, logits.dtype()));
  }
  if (tokens.size() == 0) return logits;
  const int B = logits.shape(0);
  if (o.repetition_penalty && *o.repetition_penalty != 0) {
    mx::array t = last_n(tokens, o.repetition_context_size);
    mx::array idx = mx::broadcast_to(mx::reshape(t, {1, -1}), {B, t.shape(0)});
    mx::array sel = mx::take_along_axis(logits, idx, 1);
    const float p = *o.repetition_penalty;
    sel = mx::where(mx::less(sel, weak(0, sel)), mx::multiply(sel, weak(p, sel)),
                    mx::divide(sel, weak(p, sel)));
    logits = mx::put_along_axis(logits, idx, sel, 1);
  }
  if (o.presence_penalty && *o.presence_penalty != 0) {
    mx::array t = last_n(tokens, o.presence_context_size);
    mx::array idx = mx::broadcast_to(mx::reshape(t, {1, -1}), {B, t.shape(0)});
    mx::array sel = mx::take_along_axis(logits, idx, 1);
    sel = mx::subtract(sel, weak(*o.presence_penalty, sel));
    logits = mx::put_along_axis(logits, idx, sel, 1);
  }
  if (o.frequency_penalty && *o.frequency_penalty != 0) {
    mx::array t = last_n(tokens, o.frequency_context_size);
    // logits.at[:, tokens].subtract(penalty): repeated ids accumulate.
    mx::array pen = mx::full({t.shape(0)}, weak(-*o.frequency_penalty, logits));
    logits = add_at_columns(logits, t, pen);
  }
  return logits;
}

}  // namespace lmx
