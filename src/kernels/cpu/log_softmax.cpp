#include "kernels/cpu/log_softmax.h"

#include <mlx/backend/cpu/encoder.h>
#include <mlx/primitives.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/thread_pool.h"

namespace lmx::kernels::cpu {

namespace {

class LogSoftmax : public mx::UnaryPrimitive {
 public:
  LogSoftmax(mx::Stream s, Isa isa) : mx::UnaryPrimitive(s), isa_(isa) {}

  void eval_cpu(const std::vector<mx::array>& in, mx::array& out) override {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([isa = isa_, x = mx::array::unsafe_weak_copy(in[0]),
                  out = mx::array::unsafe_weak_copy(out)]() mutable {
      const int V = x.shape(-1);
      const int rows = V == 0 ? 0 : static_cast<int>(x.size() / V);
      std::vector<float> own;
      const float* xf = nullptr;
      if (x.dtype() == mx::float32 && x.flags().row_contiguous) {
        xf = x.data<float>();
      } else {
        own.resize(x.size());
        to_f32_rows(x, own.data());
        xf = own.data();
      }
      float* of = nullptr;
      std::vector<float> obuf;
      if (out.dtype() == mx::float32) {
        of = out.data<float>();
      } else {
        obuf.resize(out.size());
        of = obuf.data();
      }
      const int chunks = (V + kLogSoftmaxChunk - 1) / kLogSoftmaxChunk;
      const MaxExpSumFn max_exp_sum = kernels_for(isa).max_exp_sum;
      std::vector<float> cm(static_cast<size_t>(rows) * chunks), cs(cm.size());
      auto span = [&](int t, int& r, int& c0, int& n) {
        r = t / chunks;
        c0 = (t % chunks) * kLogSoftmaxChunk;
        n = std::min(kLogSoftmaxChunk, V - c0);
      };
      parallel_for(rows * chunks, [&](int t) {
        int r, c0, n;
        span(t, r, c0, n);
        max_exp_sum(xf + static_cast<int64_t>(r) * V + c0, n, &cm[t], &cs[t]);
      });
      std::vector<float> lse(rows);
      for (int r = 0; r < rows; ++r) {
        float m = -std::numeric_limits<float>::infinity();
        for (int c = 0; c < chunks; ++c) m = std::max(m, cm[r * chunks + c]);
        float s = 0.0f;
        if (m != -std::numeric_limits<float>::infinity())
          for (int c = 0; c < chunks; ++c)
            if (cs[r * chunks + c] > 0.0f)
              s += cs[r * chunks + c] * std::exp(cm[r * chunks + c] - m);
        lse[r] = m + std::log(s);
      }
      parallel_for(rows * chunks, [&](int t) {
        int r, c0, n;
        span(t, r, c0, n);
        const float* src = xf + static_cast<int64_t>(r) * V + c0;
        float* dst = of + static_cast<int64_t>(r) * V + c0;
        const float l = lse[r];
        for (int i = 0; i < n; ++i) dst[i] = src[i] - l;
      });
      if (out.dtype() != mx::float32) from_f32(of, out);
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    fail("log_softmax", "the L3 CPU kernel has no GPU implementation");
  }
  const char* name() const override { return "LmxLogSoftmax"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return isa_ == static_cast<const LogSoftmax&>(other).isa_;
  }

 private:
  Isa isa_;
};

}  // namespace

mx::array log_softmax(const mx::array& x, std::optional<Isa> isa) {
  check(x.ndim() >= 1 && x.shape(-1) > 0, "log_softmax", "expected x (..., V) with V > 0, got ",
        x.ndim(), " dims");
  check(x.dtype() == mx::float32 || x.dtype() == mx::bfloat16 || x.dtype() == mx::float16,
        "log_softmax", "expected float32, bfloat16 or float16, got ", x.dtype());
  const Isa use = isa.value_or(active_isa());
  kernels_for(use);  // a forced ISA the CPU lacks fails here, not inside eval
  return mx::array(x.shape(), x.dtype(),
                   std::make_shared<LogSoftmax>(mx::default_stream(mx::Device::cpu), use), {x});
}

mx::array log_softmax_reference(const mx::array& x) {
  return mx::subtract(x, mx::logsumexp(x, -1, /*keepdims=*/true));
}

}  // namespace lmx::kernels::cpu
