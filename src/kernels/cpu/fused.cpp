#include "kernels/cpu/fused.h"

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/thread_pool.h"

namespace lmx::kernels::cpu {

namespace {

// Copies for a dispatched task that add no references, as MLX's own CPU ops capture their
// arrays: MLX's eval keeps the buffers of a primitive's inputs and outputs until the task ran.
std::vector<mx::array> weak_copies(const std::vector<mx::array>& arrays) {
  std::vector<mx::array> out;
  out.reserve(arrays.size());
  for (const auto& a : arrays) out.push_back(mx::array::unsafe_weak_copy(a));
  return out;
}

// Inputs of one QLinear inside a primitive's input list: w, scales, biases[, bias].
void push(std::vector<mx::array>& in, const QLinear& l) {
  in.insert(in.end(), {l.w, l.scales, l.biases});
  if (l.bias) in.push_back(*l.bias);
}

struct Layer {
  QWeight w;
  std::optional<mx::array> bias;  // read inside the task, once its producer has run
};

// Reads a QLinear back from the inputs at position i (advancing it).
Layer take(const std::vector<mx::array>& in, size_t& i, const QLinear& spec) {
  Layer l{qweight(in[i], in[i + 1], in[i + 2], spec.group_size, spec.bits), std::nullopt};
  i += 3;
  if (spec.bias) l.bias = mx::array::unsafe_weak_copy(in[i++]);
  return l;
}

// Layers over the same x (qmm_f32_shared), each with its bias added.
void linear(std::initializer_list<const Layer*> ls, const float* x, int M,
            std::initializer_list<float*> outs, Isa isa, Int8Mode int8) {
  std::vector<QWeight> ws;
  for (const Layer* l : ls) ws.push_back(l->w);
  qmm_f32_shared(ws.data(), static_cast<int>(ws.size()), x, M, std::data(outs), isa, int8);
  auto out = outs.begin();
  for (const Layer* l : ls) {
    float* o = *out++;
    if (!l->bias) continue;
    std::vector<float> b(l->bias->size());
    to_f32_rows(*l->bias, b.data());
    for (int64_t m = 0; m < M; ++m)
      for (int n = 0; n < l->w.N; ++n) o[m * l->w.N + n] += b[n];
  }
}

// mx::fast::rms_norm: x * rsqrt(mean(x^2) + eps) * w, per row of D.
void rms_norm(const float* x, const float* w, int M, int D, float eps, float* out) {
  for (int64_t m = 0; m < M; ++m) {
    const float* r = x + m * D;
    float ss = 0;
    for (int d = 0; d < D; ++d) ss += r[d] * r[d];
    const float inv = 1.0f / std::sqrt(ss / D + eps);
    for (int d = 0; d < D; ++d) out[m * D + d] = r[d] * inv * w[d];
  }
}

std::vector<float> f32(const mx::array& a) {
  std::vector<float> v(a.size());
  to_f32_rows(a, v.data());
  return v;
}

// cos and sin of theta for positions offsets[r] .. offsets[r] + L - 1 of each row r, (R * L, dims
// / 2) each.
struct RopeTable {
  RopeSpec spec;
  std::vector<int> offsets;
  int L = 0;
  std::vector<float> cos, sin;
  bool same(const RopeSpec& r, const std::vector<int>& o, int l) const {
    return offsets == o && L == l && spec.dims == r.dims && spec.base == r.base &&
           spec.scale == r.scale;
  }
};

// The table of the calling thread, rebuilt when the positions change: every layer of a step
// rotates the same positions.
const RopeTable& rope_table(const RopeSpec& r, const std::vector<int>& offsets, int L) {
  thread_local RopeTable t;
  if (t.same(r, offsets, L)) return t;
  const int half = r.dims / 2;
  t.spec = r;
  t.offsets = offsets;
  t.L = L;
  t.cos.resize(offsets.size() * L * half);
  t.sin.resize(t.cos.size());
  for (size_t row = 0; row < offsets.size(); ++row)
    for (int l = 0; l < L; ++l) {
      const float p = static_cast<float>(offsets[row] + l) * r.scale;
      const size_t at = (row * L + l) * half;
      for (int i = 0; i < half; ++i) {
        const float theta = p * std::exp(-static_cast<float>(i) * std::log(r.base) / half);
        t.cos[at + i] = std::cos(theta);
        t.sin[at + i] = std::sin(theta);
      }
    }
  return t;
}

// Rotates one head vector (its first dims features) at row l of the table.
void rope(float* x, const RopeTable& t, int l, const RopeSpec& r) {
  const int half = r.dims / 2;
  for (int i = 0; i < half; ++i) {
    const float c = t.cos[static_cast<size_t>(l) * half + i];
    const float s = t.sin[static_cast<size_t>(l) * half + i];
    float& a = r.traditional ? x[2L * i] : x[i];
    float& b = r.traditional ? x[2L * i + 1] : x[i + half];
    const float x1 = a, x2 = b;
    a = x1 * c - x2 * s;
    b = x1 * s + x2 * c;
  }
}

// x (M = B * L, D) float32 -> out[0] q (B, n_heads, L, hd), out[1..2] k, v (B, n_kv_heads, L,
// hd), float32: rms_norm, the projections, the q / k head norms (head_norm, when set), RoPE at
// positions offsets[b] .. (one offset for every row, or one per row: continuous batching).
void qkv_f32(const QkvSpec& spec, const std::vector<int>& offsets, const Layer& q, const Layer& k,
             const Layer& v, const float* x, const float* norm_w, const float* const* head_norm,
             int B, int L, int D, Isa isa, Int8Mode int8, std::vector<float>* out) {
  const int M = B * L, hd = spec.head_dim;
  std::vector<float> n(static_cast<size_t>(M) * D);
  rms_norm(x, norm_w, M, D, spec.norm_eps, n.data());
  const RopeTable& table = rope_table(spec.rope, offsets, L);
  const int per_row = offsets.size() == 1 ? 0 : L;  // a row's first entry in the table
  const Layer* layers[3] = {&q, &k, &v};
  const int heads[3] = {spec.n_heads, spec.n_kv_heads, spec.n_kv_heads};
  std::vector<float> y[3];
  for (int t = 0; t < 3; ++t) y[t].resize(static_cast<size_t>(M) * layers[t]->w.N);
  linear({&q, &k, &v}, n.data(), M, {y[0].data(), y[1].data(), y[2].data()}, isa, int8);
  for (int t = 0; t < 3; ++t) {
    const int N = layers[t]->w.N, H = heads[t];
    out[t].resize(y[t].size());
    // (B, L, H, hd) -> (B, H, L, hd), rotating q and k.
    for (int b = 0; b < B; ++b)
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) {
          float* dst = out[t].data() + ((static_cast<int64_t>(b) * H + h) * L + l) * hd;
          const float* src =
              y[t].data() + (static_cast<int64_t>(b) * L + l) * N + static_cast<int64_t>(h) * hd;
          std::copy(src, src + hd, dst);
          if (t < 2 && head_norm) rms_norm(dst, head_norm[t], 1, hd, *spec.qk_norm_eps, dst);
          if (t < 2) rope(dst, table, b * per_row + l, spec.rope);
        }
  }
}

// Gemma's sandwich norm weights (float32), or none.
struct Sandwich {
  const float* attn_out = nullptr;
  const float* mlp_out = nullptr;
};

// h (M, D) += o(attn); h += down(act(gate(n)) * up(n)) with n = rms_norm(h) * norm_w; with
// sandwich norms each branch is normed (rms_norm(., w) * its weight) before it is added.
void out_mlp_f32(float* h, const float* attn, int M, int D, const float* norm_w, float eps,
                 const Layer& o, const Layer& g, const Layer& u, const Layer& d, Isa isa,
                 Int8Mode int8, Activation act = Activation::silu, Sandwich sw = {}) {
  const int I = g.w.N;
  std::vector<float> y(static_cast<size_t>(M) * D), n(y.size());
  linear({&o}, attn, M, {y.data()}, isa, int8);
  if (sw.attn_out) rms_norm(y.data(), sw.attn_out, M, D, eps, y.data());
  for (size_t j = 0; j < y.size(); ++j) h[j] += y[j];
  rms_norm(h, norm_w, M, D, eps, n.data());
  std::vector<float> gv(static_cast<size_t>(M) * I), uv(gv.size());
  linear({&g, &u}, n.data(), M, {gv.data(), uv.data()}, isa, int8);
  kernels_for(isa).gate_act(gv.data(), uv.data(), static_cast<long>(gv.size()),
                            act == Activation::gelu_approx);
  linear({&d}, gv.data(), M, {y.data()}, isa, int8);
  if (sw.mlp_out) rms_norm(y.data(), sw.mlp_out, M, D, eps, y.data());
  for (size_t j = 0; j < y.size(); ++j) h[j] += y[j];
}

// gemma's clip_residual: float16 sums are clipped to float16's finite range.
void clip_f16(std::vector<float>& h) {
  constexpr float kF16Max = 65504.0f;
  for (float& e : h) e = std::clamp(e, -kF16Max, kF16Max);
}

class NormQkvRope : public mx::Primitive {
 public:
  NormQkvRope(mx::Stream s, const QkvSpec& spec, std::vector<int> offsets, const QLinear& q,
              const QLinear& k, const QLinear& v, Isa isa, Int8Mode int8)
      : mx::Primitive(s),
        spec_(spec),
        offsets_(std::move(offsets)),
        q_(q),
        k_(k),
        v_(v),
        isa_(isa),
        int8_(int8) {}

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) override {
    for (auto& o : out) o.set_data(mx::allocator::malloc(o.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    size_t i = 2;
    Layer q = take(in, i, q_), k = take(in, i, k_), v = take(in, i, v_);
    std::vector<mx::array> ins = weak_copies(in), outs = weak_copies(out);
    // The task may outlive this primitive: it captures values only.
    enc.dispatch([spec = spec_, offsets = offsets_, isa = isa_, int8 = int8_, q = std::move(q),
                  k = std::move(k), v = std::move(v), ins = std::move(ins),
                  outs = std::move(outs)]() mutable {
      const mx::array& x = ins[0];
      const int B = x.shape(0), L = x.shape(1), D = x.shape(2);
      std::vector<float> xf = f32(x), nw = f32(ins[1]), hn[2];
      const float* head_norm[2] = {nullptr, nullptr};
      if (spec.qk_norm_eps)
        for (int t = 0; t < 2; ++t) {
          hn[t] = f32(ins[ins.size() - 2 + t]);
          head_norm[t] = hn[t].data();
        }
      std::vector<float> y[3];
      qkv_f32(spec, offsets, q, k, v, xf.data(), nw.data(), spec.qk_norm_eps ? head_norm : nullptr,
              B, L, D, isa, int8, y);
      for (int t = 0; t < 3; ++t) from_f32(y[t].data(), outs[t]);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    fail("norm_qkv_rope", "the L3 CPU kernel has no GPU implementation");
  }
  const char* name() const override { return "LmxNormQkvRope"; }

 private:
  QkvSpec spec_;
  std::vector<int> offsets_;
  QLinear q_, k_, v_;  // layouts only; the arrays are the inputs
  Isa isa_;
  Int8Mode int8_;
};

class OutProjMlp : public mx::UnaryPrimitive {
 public:
  OutProjMlp(mx::Stream s, float eps, const QLinear& o, const QLinear& gate, const QLinear& up,
             const QLinear& down, Activation act, bool sandwich, Isa isa, Int8Mode int8)
      : mx::UnaryPrimitive(s),
        eps_(eps),
        act_(act),
        sandwich_(sandwich),
        o_(o),
        gate_(gate),
        up_(up),
        down_(down),
        isa_(isa),
        int8_(int8) {}

  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    size_t i = sandwich_ ? 5 : 3;
    Layer o = take(in, i, o_), g = take(in, i, gate_), u = take(in, i, up_), d = take(in, i, down_);
    std::vector<mx::array> ins = weak_copies(in);
    enc.dispatch([eps = eps_, act = act_, sandwich = sandwich_, isa = isa_, int8 = int8_,
                  o = std::move(o), g = std::move(g), u = std::move(u), d = std::move(d),
                  ins = std::move(ins), out = mx::array::unsafe_weak_copy(out)]() mutable {
      const int D = ins[0].shape(-1);
      const int M = static_cast<int>(ins[0].size() / D);
      std::vector<float> h = f32(ins[0]), attn = f32(ins[1]), nw = f32(ins[2]), sw[2];
      Sandwich norms;
      if (sandwich) {
        sw[0] = f32(ins[3]);
        sw[1] = f32(ins[4]);
        norms = {sw[0].data(), sw[1].data()};
      }
      out_mlp_f32(h.data(), attn.data(), M, D, nw.data(), eps, o, g, u, d, isa, int8, act, norms);
      if (sandwich && out.dtype() == mx::float16) clip_f16(h);
      from_f32(h.data(), out);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    fail("out_proj_mlp", "the L3 CPU kernel has no GPU implementation");
  }
  const char* name() const override { return "LmxOutProjMlp"; }

 private:
  float eps_;
  Activation act_;
  bool sandwich_;
  QLinear o_, gate_, up_, down_;
  Isa isa_;
  Int8Mode int8_;
};

// Rows [0, S) of head (b, h) of x (B, H, S, D), unit stride on D, as float32 (S, D).
template <typename T>
void head_rows(const mx::array& x, int b, int h, int S, float* out) {
  const T* p = x.data<T>() + b * x.strides()[0] + h * x.strides()[1];
  const int64_t rs = x.strides()[2];
  const int D = x.shape(3);
  for (int64_t s = 0; s < S; ++s)
    for (int d = 0; d < D; ++d) out[s * D + d] = static_cast<float>(p[s * rs + d]);
}

void head_rows_f32(const mx::array& x, int b, int h, int S, float* out) {
  if (x.dtype() == mx::float32)
    head_rows<float>(x, b, h, S, out);
  else if (x.dtype() == mx::bfloat16)
    head_rows<mx::bfloat16_t>(x, b, h, S, out);
  else
    head_rows<mx::float16_t>(x, b, h, S, out);
}

constexpr int kInPlaceRows = 8;
constexpr int kKeyChunk = 128;  // keys per decode attention task

ScaleType kv_type(mx::Dtype t) {
  return t == mx::float32 ? ScaleType::f32 : t == mx::bfloat16 ? ScaleType::bf16 : ScaleType::f16;
}

// The attention kernel's arguments for the `group` query heads of KV head kh over row b of the
// key and value buffers (L query positions of head size D); the caller sets the queries, the key
// range and the outputs.
AttnArgs group_args(const mx::array& k, const mx::array& v, int b, int kh, int L, int D, int group,
                    float scale) {
  AttnArgs a;
  a.qs = static_cast<long>(L) * D;  // the group's heads, at one query position
  a.G = group;
  a.D = D;
  a.scale = scale;
  a.os = D;
  a.K = k.data<char>() + (b * k.strides()[0] + kh * k.strides()[1]) * k.itemsize();
  a.V = v.data<char>() + (b * v.strides()[0] + kh * v.strides()[1]) * v.itemsize();
  a.ks = k.strides()[2];
  a.vs = v.strides()[2];
  a.kv_type = kv_type(k.dtype());
  return a;
}

// One row of decode attention (a few query positions): its queries (Hq, L, D) float32, row b of
// its key and value buffers (any float dtype, unit stride on D) of which it sees [0, S), its
// output (L, Hq * D) float32.
struct DecodeRow {
  const float* q;
  const mx::array* k;
  const mx::array* v;
  int b, S;
  float* o;
};

// Decode attention of rows that may each lie in their own buffers, as one parallel_for: the cache
// read in its dtype where it lies, split into chunks of keys; the chunks' partial softmax sums
// merge in a fixed order, so a row's result depends neither on the thread count nor on the other
// rows.
void decode_attention(const std::vector<DecodeRow>& rows, int Hq, int L, int D, float scale,
                      Isa isa, int window) {
  // The first key row query l sees: all of them, or the last `window` up to its own.
  const auto first_key = [&](int n) { return window > 0 ? std::max(0, n - window) : 0; };
  AttnGroupFn attend = kernels_for(isa).attn_group;
  // Task t of row r: (kh, l, chunk) in row-major order from first[r].
  std::vector<int> first(rows.size() + 1, 0), chunks(rows.size());
  int64_t work = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const int Hkv = rows[r].k->shape(1);
    chunks[r] = (rows[r].S + kKeyChunk - 1) / kKeyChunk;
    first[r + 1] = first[r] + Hkv * L * chunks[r];
    work += static_cast<int64_t>(L) * rows[r].S * Hq * D;
  }
  const int tasks = first.back();
  std::vector<int> row_of(tasks);
  for (size_t r = 0; r < rows.size(); ++r)
    std::fill(row_of.begin() + first[r], row_of.begin() + first[r + 1], static_cast<int>(r));
  const int Hkv0 = rows.empty() ? 1 : rows[0].k->shape(1);
  const int group = Hq / Hkv0;
  std::vector<float> part(static_cast<size_t>(tasks) * group * (D + 2));
  float* pm = part.data() + static_cast<size_t>(tasks) * group * D;
  float* pl = pm + static_cast<size_t>(tasks) * group;
  auto task = [&](int t) {
    const DecodeRow& row = rows[row_of[t]];
    const int nc = chunks[row_of[t]], i = t - first[row_of[t]];
    const int c = i % nc, l = i / nc % L, kh = i / nc / L;
    const int S = row.S, n = S - L + l + 1, lo = first_key(n);
    const int s0 = std::max(lo, c * kKeyChunk);
    if (s0 >= n || s0 >= (c + 1) * kKeyChunk) {
      std::fill(pm + static_cast<ptrdiff_t>(t) * group, pm + static_cast<ptrdiff_t>(t + 1) * group,
                -INFINITY);
      std::fill(pl + static_cast<ptrdiff_t>(t) * group, pl + static_cast<ptrdiff_t>(t + 1) * group,
                0.0f);
      return;
    }
    thread_local std::vector<float> sc;
    if (sc.size() < static_cast<size_t>(group) * kKeyChunk)
      sc.resize(static_cast<size_t>(group) * kKeyChunk);
    AttnArgs a = group_args(*row.k, *row.v, row.b, kh, L, D, group, scale);
    a.q = row.q + (static_cast<int64_t>(kh) * group * L + l) * D;
    a.s0 = s0;
    a.s1 = std::min(n, (c + 1) * kKeyChunk);
    a.scores = sc.data();
    a.out = part.data() + static_cast<size_t>(t) * group * D;
    a.m = pm + static_cast<ptrdiff_t>(t) * group;
    a.l = pl + static_cast<ptrdiff_t>(t) * group;
    attend(a);
  };
  // A short decode step's attention is a few microseconds of work: no pool for it.
  if (tasks > 1 && work >= (1 << 16)) {
    parallel_for(tasks, task);
  } else {
    for (int t = 0; t < tasks; ++t) task(t);
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    const int nc = chunks[r], Hkv = rows[r].k->shape(1);
    for (int j = 0; j < Hkv * L; ++j) {
      const int l = j % L, kh = j / L;
      for (int g = 0; g < group; ++g) {
        float mx = -INFINITY, sum = 0;
        const int t0 = first[r] + j * nc;
        for (int c = 0; c < nc; ++c) mx = std::max(mx, pm[(t0 + c) * group + g]);
        float* dst = rows[r].o + (static_cast<int64_t>(l) * Hq + kh * group + g) * D;
        std::fill(dst, dst + D, 0.0f);
        for (int c = 0; c < nc; ++c) {
          const int t = t0 + c;
          if (pl[t * group + g] == 0.0f) continue;
          const float w = std::exp(pm[t * group + g] - mx);
          sum += w * pl[t * group + g];
          const float* src = part.data() + (static_cast<size_t>(t) * group + g) * D;
          for (int d = 0; d < D; ++d) dst[d] += w * src[d];
        }
        for (int d = 0; d < D; ++d) dst[d] /= sum;
      }
    }
  }
}

// Causal attention of qf (B, Hq, L, D) float32 over rows [0, S) of k, v (B, Hkv, >= S, D), any
// float dtype, unit stride on D -> o (B, L, Hq * D) float32.
void attention_f32(const float* qf, int B, int Hq, int L, int D, const mx::array& k,
                   const mx::array& v, int S, float scale, Isa isa, float* o, int window = 0) {
  // The first key row query l sees: all of them, or the last `window` up to its own.
  const auto first_key = [&](int rows) { return window > 0 ? std::max(0, rows - window) : 0; };
  const int Hkv = k.shape(1), group = Hq / Hkv;
  AttnGroupFn attend = kernels_for(isa).attn_group;
  const auto base = [&](int b, int kh) { return group_args(k, v, b, kh, L, D, group, scale); };
  const auto q_at = [&](int b, int kh, int l) {
    return qf + ((static_cast<int64_t>(b) * Hq + static_cast<int64_t>(kh) * group) * L + l) * D;
  };
  const auto o_at = [&](int b, int kh, int l) {
    return o + ((static_cast<int64_t>(b) * L + l) * Hq + static_cast<int64_t>(kh) * group) * D;
  };
  if (L <= kInPlaceRows) {
    std::vector<DecodeRow> rows(B);
    for (int b = 0; b < B; ++b)
      rows[b] = {qf + static_cast<int64_t>(b) * Hq * L * D, &k, &v, b, S,
                 o + static_cast<int64_t>(b) * L * Hq * D};
    decode_attention(rows, Hq, L, D, scale, isa, window);
  } else {
    // A prefill chunk reads every key row L times: it converts each KV head to float32 once.
    std::vector<float> kf(static_cast<size_t>(S) * D), vf(kf.size());
    constexpr int kRowsPerTask = 8;
    const int row_tasks = (L + kRowsPerTask - 1) / kRowsPerTask;
    for (int b = 0; b < B; ++b)
      for (int kh = 0; kh < Hkv; ++kh) {
        head_rows_f32(k, b, kh, S, kf.data());
        head_rows_f32(v, b, kh, S, vf.data());
        AttnArgs args = base(b, kh);
        args.K = kf.data();
        args.V = vf.data();
        args.ks = args.vs = D;
        args.kv_type = ScaleType::f32;
        parallel_for(row_tasks, [&](int t) {
          thread_local std::vector<float> scores;
          if (scores.size() < static_cast<size_t>(group) * S)
            scores.resize(static_cast<size_t>(group) * S);
          std::vector<float> m(group), sum(group);
          for (int l = t * kRowsPerTask; l < std::min(L, (t + 1) * kRowsPerTask); ++l) {
            AttnArgs a = args;
            a.q = q_at(b, kh, l);
            a.s1 = S - L + l + 1;
            a.s0 = first_key(a.s1);
            a.scores = scores.data();
            a.out = o_at(b, kh, l);
            a.m = m.data();
            a.l = sum.data();
            attend(a);
            for (int g = 0; g < group; ++g)
              for (int d = 0; d < D; ++d) a.out[g * D + d] /= sum[g];
          }
        });
      }
  }
}

class CausalAttention : public mx::UnaryPrimitive {
 public:
  CausalAttention(mx::Stream s, float scale, Isa isa)
      : mx::UnaryPrimitive(s), scale_(scale), isa_(isa) {}

  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    for (const auto& a : in)
      check(a.strides()[3] == 1, "causal_attention", "q, k and v need a unit stride on D");
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([scale = scale_, isa = isa_, q = mx::array::unsafe_weak_copy(in[0]),
                  k = mx::array::unsafe_weak_copy(in[1]), v = mx::array::unsafe_weak_copy(in[2]),
                  out = mx::array::unsafe_weak_copy(out)]() mutable {
      const int B = q.shape(0), Hq = q.shape(1), L = q.shape(2), D = q.shape(3);
      const int S = k.shape(2);
      std::vector<float> qf(q.size()), o(static_cast<size_t>(B) * L * Hq * D);
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < Hq; ++h)
          head_rows_f32(q, b, h, L, qf.data() + (static_cast<int64_t>(b) * Hq + h) * L * D);
      attention_f32(qf.data(), B, Hq, L, D, k, v, S, scale, isa, o.data());
      from_f32(o.data(), out);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    fail("causal_attention", "the L3 CPU kernel has no GPU implementation");
  }
  const char* name() const override { return "LmxCausalAttention"; }

 private:
  float scale_;
  Isa isa_;
};

// p[0 .. n) rounded to dtype and back: what storing them in an array of that dtype does.
void round_to(mx::Dtype dtype, float* p, size_t n) {
  if (dtype == mx::bfloat16) {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(static_cast<mx::bfloat16_t>(p[i]));
  } else if (dtype == mx::float16) {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(static_cast<mx::float16_t>(p[i]));
  }
}

// Rows (B, H, L, hd) float32 into rows [offset, offset + L) of buf (B, H, capacity, hd).
template <typename T>
void write_rows(const float* src, int B, int H, int L, int hd, int offset, mx::array& buf) {
  T* base = buf.data<T>();
  const auto& st = buf.strides();
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int l = 0; l < L; ++l) {
        T* dst = base + b * st[0] + h * st[1] + (offset + l) * st[2];
        const float* r = src + ((static_cast<int64_t>(b) * H + h) * L + l) * hd;
        for (int d = 0; d < hd; ++d) dst[d] = static_cast<T>(r[d]);
      }
}

void write_rows_as(const float* src, int B, int H, int L, int hd, int offset, mx::array& buf) {
  if (buf.dtype() == mx::float32)
    write_rows<float>(src, B, H, L, hd, offset, buf);
  else if (buf.dtype() == mx::bfloat16)
    write_rows<mx::bfloat16_t>(src, B, H, L, hd, offset, buf);
  else
    write_rows<mx::float16_t>(src, B, H, L, hd, offset, buf);
}

// The whole layer: inputs x, input_norm, post_norm, [attn_out, mlp_out (sandwich norms)], q, k, v,
// o, gate, up, down (QLinear each), [q_norm, k_norm], keys, values; outputs h, keys, values.
class DecoderLayerPrim : public mx::Primitive {
 public:
  DecoderLayerPrim(mx::Stream s, const DecoderLayerSpec& spec, int offset, bool in_place,
                   const KvSlots& slots, const DecoderLayerWeights& w, Isa isa, Int8Mode int8)
      : mx::Primitive(s),
        spec_(spec),
        offset_(offset),
        in_place_(in_place),
        slots_(slots),
        sandwich_(w.sandwich.has_value()),
        q_(w.q),
        k_(w.k),
        v_(w.v),
        o_(w.o),
        g_(w.gate),
        u_(w.up),
        d_(w.down),
        isa_(isa),
        int8_(int8) {}

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) override {
    auto& enc = mx::cpu::get_command_encoder(stream());
    out[0].set_data(mx::allocator::malloc(out[0].nbytes()));
    // The cache buffers: written where they lie when the cache vouches that no array of them
    // has left it (MLX's is_donatable cannot tell: each of the three outputs holds the inputs),
    // else copied first.
    bool copy[2] = {false, false};
    for (int t = 0; t < 2; ++t) {
      const mx::array& buf = in[in.size() - 2 + t];
      check(buf.flags().row_contiguous, "decoder_layer", "the cache buffers must be contiguous");
      if (in_place_ && buf.data_shared_ptr().use_count() == 1 &&
          buf.data_shared_ptr()->is_owned()) {
        out[1 + t].copy_shared_buffer(buf);
      } else {
        out[1 + t].set_data(mx::allocator::malloc(out[1 + t].nbytes()));
        copy[t] = true;
      }
    }
    size_t i = sandwich_ ? 5 : 3;
    Layer q = take(in, i, q_), k = take(in, i, k_), v = take(in, i, v_), o = take(in, i, o_),
          g = take(in, i, g_), u = take(in, i, u_), d = take(in, i, d_);
    std::vector<mx::array> ins = weak_copies(in), outs = weak_copies(out);
    enc.dispatch([spec = spec_, offset = offset_, slots = slots_, sandwich = sandwich_, isa = isa_,
                  int8 = int8_, q = std::move(q), k = std::move(k), v = std::move(v),
                  o = std::move(o), g = std::move(g), u = std::move(u), d = std::move(d),
                  ins = std::move(ins), outs = std::move(outs), copy0 = copy[0],
                  copy1 = copy[1]]() mutable {
      const mx::array& x = ins[0];
      const int B = x.shape(0), L = x.shape(1), D = x.shape(2), M = B * L;
      const QkvSpec& qs = spec.qkv;
      const int hd = qs.head_dim;
      mx::array& kbuf = outs[1];
      mx::array& vbuf = outs[2];
      const size_t n = ins.size();
      if (copy0) std::memcpy(kbuf.data<char>(), ins[n - 2].data<char>(), kbuf.nbytes());
      if (copy1) std::memcpy(vbuf.data<char>(), ins[n - 1].data<char>(), vbuf.nbytes());
      std::vector<float> h = f32(x), nw = f32(ins[1]), pw = f32(ins[2]), hn[2], sw[2];
      Sandwich norms;
      if (sandwich) {
        sw[0] = f32(ins[3]);
        sw[1] = f32(ins[4]);
        norms = {sw[0].data(), sw[1].data()};
      }
      const float* head_norm[2] = {nullptr, nullptr};
      if (qs.qk_norm_eps)
        for (int t = 0; t < 2; ++t) {
          hn[t] = f32(ins[n - 4 + t]);
          head_norm[t] = hn[t].data();
        }
      std::vector<float> y[3];
      qkv_f32(qs, {offset}, q, k, v, h.data(), nw.data(), qs.qk_norm_eps ? head_norm : nullptr, B,
              L, D, isa, int8, y);
      // The rounding the layer's separate primitives apply to q and to the attention output.
      round_to(x.dtype(), y[0].data(), y[0].size());
      const int pos = slots.pos < 0 ? offset : slots.pos;
      const int rows = slots.pos < 0 ? offset + L : slots.rows;
      write_rows_as(y[1].data(), B, qs.n_kv_heads, L, hd, pos, kbuf);
      write_rows_as(y[2].data(), B, qs.n_kv_heads, L, hd, pos, vbuf);
      std::vector<float> attn(static_cast<size_t>(M) * qs.n_heads * hd);
      attention_f32(y[0].data(), B, qs.n_heads, L, hd, kbuf, vbuf, rows, spec.attn_scale, isa,
                    attn.data(), slots.window);
      round_to(x.dtype(), attn.data(), attn.size());
      out_mlp_f32(h.data(), attn.data(), M, D, pw.data(), spec.mlp_norm_eps, o, g, u, d, isa, int8,
                  spec.act, norms);
      if (sandwich && x.dtype() == mx::float16) clip_f16(h);
      from_f32(h.data(), outs[0]);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    fail("decoder_layer", "the L3 CPU kernel has no GPU implementation");
  }
  const char* name() const override { return "LmxDecoderLayer"; }

 private:
  DecoderLayerSpec spec_;
  int offset_;
  bool in_place_;
  KvSlots slots_;
  bool sandwich_;
  QLinear q_, k_, v_, o_, g_, u_, d_;  // layouts only; the arrays are the inputs
  Isa isa_;
  Int8Mode int8_;
};

// Decode attention of B rows over their own caches: inputs q, k_new, v_new (B, H, 1, D), then
// each row's key and value buffers; outputs o (B, Hq, 1, D), then each row's buffers written.
class RowsDecodeAttention : public mx::Primitive {
 public:
  RowsDecodeAttention(mx::Stream s, std::vector<int> offsets, std::vector<bool> in_place,
                      float scale, Isa isa)
      : mx::Primitive(s),
        offsets_(std::move(offsets)),
        in_place_(std::move(in_place)),
        scale_(scale),
        isa_(isa) {}

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) override {
    auto& enc = mx::cpu::get_command_encoder(stream());
    out[0].set_data(mx::allocator::malloc(out[0].nbytes()));
    // As DecoderLayerPrim: a buffer is written where it lies when its cache vouches for it.
    std::vector<char> copy(out.size(), 0);
    for (size_t t = 1; t < out.size(); ++t) {
      const mx::array& buf = in[2 + t];
      check(buf.flags().row_contiguous, "rows_decode_attention",
            "the cache buffers must be contiguous");
      if (in_place_[(t - 1) / 2] && buf.data_shared_ptr().use_count() == 1 &&
          buf.data_shared_ptr()->is_owned()) {
        out[t].copy_shared_buffer(buf);
      } else {
        out[t].set_data(mx::allocator::malloc(out[t].nbytes()));
        copy[t] = 1;
      }
    }
    std::vector<mx::array> ins = weak_copies(in), outs = weak_copies(out);
    enc.dispatch([offsets = offsets_, scale = scale_, isa = isa_, copy = std::move(copy),
                  ins = std::move(ins), outs = std::move(outs)]() mutable {
      const mx::array& q = ins[0];
      const int B = q.shape(0), Hq = q.shape(1), D = q.shape(3), Hkv = ins[1].shape(1);
      std::vector<float> qf(q.size()), kf(static_cast<size_t>(Hkv) * D), vf(kf.size());
      std::vector<float> o(q.size());
      std::vector<DecodeRow> rows(B);
      for (int b = 0; b < B; ++b) {
        mx::array& kbuf = outs[1 + 2 * b];
        mx::array& vbuf = outs[2 + 2 * b];
        if (copy[1 + 2 * b])
          std::memcpy(kbuf.data<char>(), ins[3 + 2 * b].data<char>(), kbuf.nbytes());
        if (copy[2 + 2 * b])
          std::memcpy(vbuf.data<char>(), ins[4 + 2 * b].data<char>(), vbuf.nbytes());
        float* qb = qf.data() + static_cast<int64_t>(b) * Hq * D;
        for (int h = 0; h < Hq; ++h) head_rows_f32(q, b, h, 1, qb + static_cast<int64_t>(h) * D);
        for (int h = 0; h < Hkv; ++h) {
          head_rows_f32(ins[1], b, h, 1, kf.data() + static_cast<int64_t>(h) * D);
          head_rows_f32(ins[2], b, h, 1, vf.data() + static_cast<int64_t>(h) * D);
        }
        write_rows_as(kf.data(), 1, Hkv, 1, D, offsets[b], kbuf);
        write_rows_as(vf.data(), 1, Hkv, 1, D, offsets[b], vbuf);
        rows[b] = {qb, &kbuf,          &vbuf,
                   0,  offsets[b] + 1, o.data() + static_cast<int64_t>(b) * Hq * D};
      }
      // All rows' attention in one parallel_for (each row's as it would run alone).
      decode_attention(rows, Hq, 1, D, scale, isa, 0);
      from_f32(o.data(), outs[0]);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    fail("rows_decode_attention", "the L3 CPU kernel has no GPU implementation");
  }
  const char* name() const override { return "LmxRowsDecodeAttention"; }

 private:
  std::vector<int> offsets_;
  std::vector<bool> in_place_;
  float scale_;
  Isa isa_;
};

void check_linear(const QLinear& l, int in, const char* where) {
  check(supports(l.bits, l.group_size, "affine", l.scales.dtype()) && l.w.ndim() == 2 &&
            l.w.shape(1) * 32 / l.bits == in,
        where, "a projection takes ", l.w.shape(1) * 32 / l.bits, " inputs, expected ", in);
}

}  // namespace

std::vector<mx::array> norm_qkv_rope(const mx::array& x, const mx::array& norm_weight,
                                     const QLinear& q, const QLinear& k, const QLinear& v,
                                     const QkvSpec& spec, int offset,
                                     const std::optional<QkNorm>& qk_norm) {
  return norm_qkv_rope(x, norm_weight, q, k, v, spec, std::vector<int>{offset}, qk_norm);
}

std::vector<mx::array> norm_qkv_rope(const mx::array& x, const mx::array& norm_weight,
                                     const QLinear& q, const QLinear& k, const QLinear& v,
                                     const QkvSpec& spec, const std::vector<int>& offsets,
                                     const std::optional<QkNorm>& qk_norm) {
  const char* where = "norm_qkv_rope";
  check(spec.qk_norm_eps.has_value() == qk_norm.has_value(), where,
        "q/k head norms need both the weights and qk_norm_eps");
  check(x.ndim() == 3, where, "expected x (B, L, D), got ", x.ndim(), " dims");
  const int B = x.shape(0), L = x.shape(1), D = x.shape(2), hd = spec.head_dim;
  check(offsets.size() == 1 || static_cast<int>(offsets.size()) == B, where,
        "expected one offset or one per row (", B, "), got ", offsets.size());
  for (int o : offsets) check(o >= 0, where, "expected offsets >= 0, got ", o);
  for (const QLinear* l : {&q, &k, &v}) check_linear(*l, D, where);
  check(q.w.shape(0) == spec.n_heads * hd && k.w.shape(0) == spec.n_kv_heads * hd &&
            v.w.shape(0) == spec.n_kv_heads * hd && spec.rope.dims <= hd,
        where, "projection sizes do not match ", spec.n_heads, " / ", spec.n_kv_heads, " heads of ",
        hd);
  std::vector<mx::array> in = {x, norm_weight};
  for (const QLinear* l : {&q, &k, &v}) push(in, *l);
  if (qk_norm) in.insert(in.end(), {qk_norm->q, qk_norm->k});
  const Isa isa = active_isa();
  auto prim = std::make_shared<NormQkvRope>(mx::default_stream(mx::Device::cpu), spec, offsets, q,
                                            k, v, isa, int8_mode());
  return mx::array::make_arrays(
      {{B, spec.n_heads, L, hd}, {B, spec.n_kv_heads, L, hd}, {B, spec.n_kv_heads, L, hd}},
      {x.dtype(), x.dtype(), x.dtype()}, prim, in);
}

mx::array causal_attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale,
                           std::optional<Isa> isa) {
  const char* where = "causal_attention";
  check(q.ndim() == 4 && k.ndim() == 4 && v.shape() == k.shape() && q.shape(0) == k.shape(0) &&
            q.shape(3) == k.shape(3) && k.shape(1) > 0 && q.shape(1) % k.shape(1) == 0 &&
            k.shape(2) >= q.shape(2),
        where, "expected q (B, Hq, L, D) and k, v (B, Hkv, S >= L, D) with Hq a multiple of Hkv");
  check(q.shape(3) <= kAttnMaxD, where, "head_dim ", q.shape(3), " exceeds the kernel's ",
        kAttnMaxD);
  for (const mx::array* a : {&q, &k, &v})
    check(a->dtype() == mx::float32 || a->dtype() == mx::bfloat16 || a->dtype() == mx::float16,
          where, "q, k and v must be float32, bfloat16 or float16, got ", a->dtype());
  check(k.dtype() == v.dtype(), where, "k and v must share a dtype, got ", k.dtype(), " and ",
        v.dtype());
  const Isa use = isa.value_or(active_isa());
  kernels_for(use);  // a forced ISA the CPU lacks fails here, not inside eval
  auto prim = std::make_shared<CausalAttention>(mx::default_stream(mx::Device::cpu), scale, use);
  return mx::array({q.shape(0), q.shape(2), q.shape(1) * q.shape(3)}, q.dtype(), prim, {q, k, v});
}

mx::array out_proj_mlp(const mx::array& h, const mx::array& attn, const QLinear& o,
                       const mx::array& norm_weight, float norm_eps, const QLinear& gate,
                       const QLinear& up, const QLinear& down, Activation act,
                       const std::optional<SandwichNorms>& sandwich) {
  const char* where = "out_proj_mlp";
  const int D = h.shape(-1);
  check_linear(o, attn.shape(-1), where);
  check_linear(gate, D, where);
  check_linear(up, D, where);
  check_linear(down, gate.w.shape(0), where);
  check(o.w.shape(0) == D && down.w.shape(0) == D && up.w.shape(0) == gate.w.shape(0) && !o.bias &&
            !gate.bias && !up.bias && !down.bias,
        where, "expected bias-free projections back to ", D, " features");
  std::vector<mx::array> in = {h, attn, norm_weight};
  if (sandwich) {
    for (const mx::array* n : {&sandwich->attn_out, &sandwich->mlp_out})
      check(n->ndim() == 1 && n->shape(0) == D, where, "expected sandwich norm weights of ", D,
            " features");
    in.insert(in.end(), {sandwich->attn_out, sandwich->mlp_out});
  }
  for (const QLinear* l : {&o, &gate, &up, &down}) push(in, *l);
  auto prim =
      std::make_shared<OutProjMlp>(mx::default_stream(mx::Device::cpu), norm_eps, o, gate, up, down,
                                   act, sandwich.has_value(), active_isa(), int8_mode());
  return mx::array(h.shape(), h.dtype(), prim, in);
}

std::vector<mx::array> decoder_layer(const mx::array& x, const mx::array& keys,
                                     const mx::array& values, int offset,
                                     const DecoderLayerWeights& w, const DecoderLayerSpec& spec,
                                     bool in_place, const KvSlots& slots) {
  const char* where = "decoder_layer";
  const QkvSpec& qs = spec.qkv;
  check(qs.qk_norm_eps.has_value() == w.qk_norm.has_value(), where,
        "q/k head norms need both the weights and qk_norm_eps");
  check(x.ndim() == 3, where, "expected x (B, L, D), got ", x.ndim(), " dims");
  const int B = x.shape(0), L = x.shape(1), D = x.shape(2), hd = qs.head_dim;
  for (const QLinear* l : {&w.q, &w.k, &w.v}) check_linear(*l, D, where);
  check(w.q.w.shape(0) == qs.n_heads * hd && w.k.w.shape(0) == qs.n_kv_heads * hd &&
            w.v.w.shape(0) == qs.n_kv_heads * hd && qs.rope.dims <= hd && hd <= kAttnMaxD &&
            qs.n_kv_heads > 0 && qs.n_heads % qs.n_kv_heads == 0,
        where, "projection sizes do not match ", qs.n_heads, " / ", qs.n_kv_heads, " heads of ",
        hd);
  check_linear(w.o, qs.n_heads * hd, where);
  check_linear(w.gate, D, where);
  check_linear(w.up, D, where);
  check_linear(w.down, w.gate.w.shape(0), where);
  check(w.o.w.shape(0) == D && w.down.w.shape(0) == D && w.up.w.shape(0) == w.gate.w.shape(0) &&
            !w.o.bias && !w.gate.bias && !w.up.bias && !w.down.bias,
        where, "expected bias-free projections back to ", D, " features");
  const mx::Shape buf{B, qs.n_kv_heads, keys.ndim() == 4 ? keys.shape(2) : 0, hd};
  const int pos = slots.pos < 0 ? offset : slots.pos;
  const int rows = slots.pos < 0 ? offset + L : slots.rows;
  check(slots.window >= 0 && rows <= buf[2] && (L == 1 ? pos < rows : pos + L == rows), where,
        "expected the new rows at ", pos, " inside the ", rows, " rows attention reads (the last ",
        "ones for a step of ", L, " > 1) and a window >= 0, got window ", slots.window);
  check(keys.shape() == buf && values.shape() == buf && offset >= 0 && pos >= 0 &&
            pos + L <= buf[2] && keys.dtype() == values.dtype() &&
            (keys.dtype() == mx::float32 || keys.dtype() == mx::bfloat16 ||
             keys.dtype() == mx::float16),
        where, "expected cache buffers (", B, ", ", qs.n_kv_heads, ", >= ", offset + L, ", ", hd,
        ") of one float dtype");
  for (const mx::array* n : {&w.input_norm, &w.post_norm})
    check(n->ndim() == 1 && n->shape(0) == D, where, "expected norm weights of ", D, " features");
  std::vector<mx::array> in = {x, w.input_norm, w.post_norm};
  if (w.sandwich) {
    for (const mx::array* n : {&w.sandwich->attn_out, &w.sandwich->mlp_out})
      check(n->ndim() == 1 && n->shape(0) == D, where, "expected sandwich norm weights of ", D,
            " features");
    in.insert(in.end(), {w.sandwich->attn_out, w.sandwich->mlp_out});
  }
  for (const QLinear* l : {&w.q, &w.k, &w.v, &w.o, &w.gate, &w.up, &w.down}) push(in, *l);
  if (w.qk_norm) in.insert(in.end(), {w.qk_norm->q, w.qk_norm->k});
  in.insert(in.end(), {keys, values});
  auto prim = std::make_shared<DecoderLayerPrim>(mx::default_stream(mx::Device::cpu), spec, offset,
                                                 in_place, slots, w, active_isa(), int8_mode());
  return mx::array::make_arrays({x.shape(), keys.shape(), values.shape()},
                                {x.dtype(), keys.dtype(), values.dtype()}, prim, in);
}

std::vector<mx::array> rows_decode_attention(const mx::array& q, const mx::array& k_new,
                                             const mx::array& v_new,
                                             const std::vector<mx::array>& keys,
                                             const std::vector<mx::array>& values,
                                             const std::vector<int>& offsets,
                                             const std::vector<bool>& in_place, float scale) {
  const char* where = "rows_decode_attention";
  check(q.ndim() == 4 && q.shape(2) == 1 && k_new.ndim() == 4 && v_new.shape() == k_new.shape() &&
            k_new.shape(0) == q.shape(0) && k_new.shape(2) == 1 && k_new.shape(3) == q.shape(3) &&
            k_new.shape(1) > 0 && q.shape(1) % k_new.shape(1) == 0,
        where, "expected q (B, Hq, 1, D) and k, v (B, Hkv, 1, D) with Hq a multiple of Hkv");
  const int B = q.shape(0), Hkv = k_new.shape(1), D = q.shape(3);
  check(D <= kAttnMaxD, where, "head_dim ", D, " exceeds the kernel's ", kAttnMaxD);
  check(static_cast<int>(keys.size()) == B && values.size() == keys.size() &&
            offsets.size() == keys.size() && in_place.size() == keys.size(),
        where, "expected one buffer pair, offset and in-place flag per row, got ", keys.size(),
        " for ", B, " rows");
  std::vector<mx::array> in = {q, k_new, v_new};
  std::vector<mx::Shape> shapes = {q.shape()};
  std::vector<mx::Dtype> dtypes = {q.dtype()};
  for (int b = 0; b < B; ++b) {
    for (const mx::array* buf : {&keys[b], &values[b]}) {
      check(buf->ndim() == 4 && buf->shape(0) == 1 && buf->shape(1) == Hkv && buf->shape(3) == D &&
                offsets[b] >= 0 && offsets[b] < buf->shape(2) &&
                (buf->dtype() == mx::float32 || buf->dtype() == mx::bfloat16 ||
                 buf->dtype() == mx::float16),
            where, "row ", b, ": expected cache buffers (1, ", Hkv, ", > ", offsets[b], ", ", D,
            ") of a float dtype");
      in.push_back(*buf);
      shapes.push_back(buf->shape());
      dtypes.push_back(buf->dtype());
    }
  }
  auto prim = std::make_shared<RowsDecodeAttention>(mx::default_stream(mx::Device::cpu), offsets,
                                                    in_place, scale, active_isa());
  return mx::array::make_arrays(std::move(shapes), std::move(dtypes), prim, std::move(in));
}

}  // namespace lmx::kernels::cpu
