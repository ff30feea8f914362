#include "kernels/cpu/gather_qmm.h"

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace lmx::kernels::cpu {

namespace {

ScaleType scale_type_of(mx::Dtype t) {
  return t == mx::float32 ? ScaleType::f32 : t == mx::bfloat16 ? ScaleType::bf16 : ScaleType::f16;
}

// indices (B) of any integer dtype -> int64.
std::vector<int64_t> expert_ids(const mx::array& idx) {
  std::vector<int64_t> out(idx.size());
  auto read = [&](auto* p) {
    // A broadcast view: unravel each element over the strides.
    const auto& shape = idx.shape();
    const auto& strides = idx.strides();
    for (size_t b = 0; b < out.size(); ++b) {
      int64_t off = 0, r = static_cast<int64_t>(b);
      for (int d = idx.ndim() - 1; d >= 0; --d) {
        off += (r % shape[d]) * strides[d];
        r /= shape[d];
      }
      out[b] = static_cast<int64_t>(p[off]);
    }
  };
  switch (idx.dtype()) {
    case mx::int32:
      read(idx.data<int32_t>());
      break;
    case mx::uint32:
      read(idx.data<uint32_t>());
      break;
    case mx::int64:
      read(idx.data<int64_t>());
      break;
    case mx::uint64:
      read(idx.data<uint64_t>());
      break;
    case mx::int16:
      read(idx.data<int16_t>());
      break;
    case mx::uint16:
      read(idx.data<uint16_t>());
      break;
    case mx::int8:
      read(idx.data<int8_t>());
      break;
    default:
      read(idx.data<uint8_t>());
      break;
  }
  return out;
}

// Expert e of the stacked weight (E, N, ...): its rows as a QWeight (its packed copy named by
// its own address and the stacked buffer's owner).
QWeight expert(const QWeight& all, int e) {
  QWeight w = all;
  const long groups = all.K / all.group_size;
  const long ss = all.scale_type == ScaleType::f32 ? 4 : 2;
  w.w = all.w + static_cast<long>(e) * all.N * all.K * all.bits / 8;
  w.scales = static_cast<const char*>(all.scales) + e * all.N * groups * ss;
  w.biases = static_cast<const char*>(all.biases) + e * all.N * groups * ss;
  return w;
}

// inputs: x (B, M, K) (a broadcast view), w, scales, biases (E, ...), indices (B).
void gather_rows(const mx::array& x, const QWeight& all, int E, const mx::array& indices,
                 mx::array& out, Isa isa, Int8Mode int8) {
  const int K = x.shape(-1), M = x.shape(-2), N = all.N;
  const std::vector<int64_t> ids = expert_ids(indices);
  const int B = static_cast<int>(ids.size());
  std::vector<float> xf(static_cast<size_t>(B) * M * K);
  to_f32_rows(x, xf.data());
  // Counting sort of the pairs by expert (stable: each expert's rows in input order).
  std::vector<int> count(E + 1, 0);
  for (int64_t e : ids)
    if (e >= 0 && e < E) ++count[e + 1];
  for (int e = 0; e < E; ++e) count[e + 1] += count[e];
  std::vector<int> order(count[E]);
  {
    std::vector<int> at(count.begin(), count.end() - 1);
    for (int b = 0; b < B; ++b)
      if (ids[b] >= 0 && ids[b] < E) order[at[ids[b]]++] = b;
  }
  const size_t row = static_cast<size_t>(M) * K;
  std::vector<float> xs(static_cast<size_t>(count[E]) * row);
  for (size_t j = 0; j < order.size(); ++j)
    std::memcpy(xs.data() + j * row, xf.data() + order[j] * row, row * sizeof(float));
  std::vector<float> ys(static_cast<size_t>(count[E]) * M * N);
  std::vector<QWeight> ws;
  std::vector<const float*> xp;
  std::vector<float*> yp;
  std::vector<int> ms;
  for (int e = 0; e < E; ++e) {
    if (count[e + 1] == count[e]) continue;
    ws.push_back(expert(all, e));
    xp.push_back(xs.data() + count[e] * row);
    yp.push_back(ys.data() + static_cast<size_t>(count[e]) * M * N);
    ms.push_back((count[e + 1] - count[e]) * M);
  }
  qmm_f32_pairs(ws.data(), static_cast<int>(ws.size()), xp.data(), ms.data(), yp.data(), isa, int8);
  // Back to the pairs' order; pairs of an invalid id stay zeros.
  const size_t orow = static_cast<size_t>(M) * N;
  std::vector<float> of(static_cast<size_t>(B) * orow, 0.0f);
  for (size_t j = 0; j < order.size(); ++j)
    std::memcpy(of.data() + order[j] * orow, ys.data() + j * orow, orow * sizeof(float));
  from_f32(of.data(), out);
}

class LmxGatherQuantizedMatmul : public mx::UnaryPrimitive {
 public:
  LmxGatherQuantizedMatmul(mx::Stream s, int group_size, int bits, Isa isa, Int8Mode int8)
      : mx::UnaryPrimitive(s), group_size_(group_size), bits_(bits), isa_(isa), int8_(int8) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& x = inputs[0];
    const mx::array& w = inputs[1];
    const mx::array& scales = inputs[2];
    const mx::array& biases = inputs[3];
    const mx::array& indices = inputs[4];
    for (const mx::array* a : {&w, &scales, &biases})
      check(a->flags().row_contiguous, "gather_quantized_matmul",
            "the weight, scales and biases must be row-contiguous");
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const mx::array& a : inputs) enc.set_input_array(a);
    enc.set_output_array(out);
    // One expert's (N, K / 32 * bits) slice of the stacked weight, as qmm.h's QWeight.
    QWeight all{w.data<unsigned char>(),
                scales.data<void>(),
                biases.data<void>(),
                scale_type_of(scales.dtype()),
                w.shape(1),
                w.shape(2) * 32 / bits_,
                group_size_,
                bits_,
                w.data_shared_ptr()};
    enc.dispatch([all, E = w.shape(0), isa = isa_, int8 = int8_, x = mx::array::unsafe_weak_copy(x),
                  idx = mx::array::unsafe_weak_copy(indices),
                  out = mx::array::unsafe_weak_copy(out)]() mutable {
      gather_rows(x, all, E, idx, out, isa, int8);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    fail("gather_quantized_matmul", "the L3 CPU kernel has no GPU implementation");
  }

  const char* name() const override { return "LmxGatherQuantizedMatmul"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const LmxGatherQuantizedMatmul&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_ && isa_ == o.isa_ && int8_ == o.int8_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    mx::Shape s = inputs[0].shape();
    s.back() = inputs[1].shape(1);
    return {s};
  }

 private:
  int group_size_, bits_;
  Isa isa_;
  Int8Mode int8_;
};

}  // namespace

mx::array gather_quantized_matmul(const mx::array& x, const mx::array& w, const mx::array& scales,
                                  const mx::array& biases, const mx::array& indices,
                                  const QmmOptions& opt) {
  const char* where = "gather_quantized_matmul";
  check(supports(opt.bits, opt.group_size, "affine", scales.dtype()), where,
        "unsupported layout, expected bits 2/3/4/5/6/8, group size 32/64/128 and float scales, "
        "got bits=",
        opt.bits, " group_size=", opt.group_size, " scales ", scales.dtype());
  check(x.ndim() >= 2 && w.ndim() == 3 && w.dtype() == mx::uint32, where,
        "expected x (..., M, K) and a 3-D uint32 weight (experts, N, K * bits / 32), got x of ",
        x.ndim(), " dims, weight of ", w.ndim(), " dims");
  check(x.dtype() == mx::float32 || x.dtype() == mx::bfloat16 || x.dtype() == mx::float16, where,
        "x must be float32, bfloat16 or float16, got ", x.dtype());
  check(mx::issubdtype(indices.dtype(), mx::integer), where, "indices must be integers, got ",
        indices.dtype());
  const int K = x.shape(-1), M = x.shape(-2);
  const int E = w.shape(0), N = w.shape(1);
  check(w.shape(2) * 32 == K * opt.bits, where, "x has K=", K, ", expected ",
        w.shape(2) * 32 / opt.bits, " for the packed weight of ", w.shape(2), " words");
  const mx::Shape gshape{E, N, K / opt.group_size};
  check(K % opt.group_size == 0 && scales.shape() == gshape && biases.shape() == gshape &&
            biases.dtype() == scales.dtype(),
        where, "scales and biases must both be (", E, ", ", N, ", ", K / opt.group_size,
        ") of one dtype");
  const mx::Shape xbatch(x.shape().begin(), x.shape().end() - 2);
  const mx::Shape batch = mx::broadcast_shapes(xbatch, indices.shape());
  mx::Shape xshape = batch;
  xshape.push_back(M);
  xshape.push_back(K);
  const Isa isa = opt.isa.value_or(active_isa());
  kernels_for(isa);  // a forced ISA the CPU lacks fails here, not inside eval
  mx::Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  return mx::array(
      out_shape, opt.out_dtype.value_or(mx::promote_types(x.dtype(), scales.dtype())),
      std::make_shared<LmxGatherQuantizedMatmul>(mx::default_stream(mx::Device::cpu),
                                                 opt.group_size, opt.bits, isa,
                                                 opt.int8.value_or(int8_mode())),
      {mx::broadcast_to(x, xshape), w, scales, biases, mx::broadcast_to(indices, batch)});
}

void prepack_experts(const mx::array& w, const mx::array& scales, const mx::array& biases,
                     int group_size, int bits) {
  const bool wide = (bits == 5 || bits == 6) && widening() && int8_max_bits(active_isa()) >= 8;
  const bool pack = (bits == 4 || bits == 8 || wide) && int8_packed(active_isa());
  if (int8_mode() == Int8Mode::off || !(wide || pack)) return;
  mx::eval(w, scales, biases);
  if (!w.flags().row_contiguous || !scales.flags().row_contiguous ||
      !biases.flags().row_contiguous || w.ndim() != 3)
    return;  // the kernel's own error at the first call
  const QWeight all{w.data<unsigned char>(),
                    scales.data<void>(),
                    biases.data<void>(),
                    scale_type_of(scales.dtype()),
                    w.shape(1),
                    w.shape(2) * 32 / bits,
                    group_size,
                    bits,
                    w.data_shared_ptr()};
  for (int e = 0; e < w.shape(0); ++e) {
    const QWeight q = expert(all, e);
    if (pack)
      packed_weight(q);  // a 5/6-bit expert's byte-wide copy only while it is packed
    else
      widened_weight(q);
  }
}

bool moe_experts() {
  static const bool on = [] {
    const char* env = std::getenv("LMX_CPU_MOE");
    if (!env || !*env || std::strcmp(env, "1") == 0) return true;
    if (std::strcmp(env, "0") == 0) return false;
    fail("LMX_CPU_MOE", "expected 0 or 1, got '", env, "'");
  }();
  return on;
}

}  // namespace lmx::kernels::cpu
