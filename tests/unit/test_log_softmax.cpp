// The CPU tier's log_softmax against the MLX computation it replaces in the token loop.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/log_softmax.h"

namespace mx = mlx::core;
namespace kc = lmx::kernels::cpu;

namespace {

// The largest |got - want| over the finite entries; non-finite entries must match exactly.
float max_abs_diff(const mx::array& got, const mx::array& want) {
  mx::array g = mx::astype(got, mx::float32), w = mx::astype(want, mx::float32);
  mx::eval({g, w});
  const float* gp = g.data<float>();
  const float* wp = w.data<float>();
  float worst = 0.0f;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(wp[i])) {
      EXPECT_EQ(std::isnan(gp[i]), std::isnan(wp[i])) << "at " << i;
      if (!std::isnan(wp[i])) {
        EXPECT_EQ(gp[i], wp[i]) << "at " << i;
      }
      continue;
    }
    worst = std::max(worst, std::abs(gp[i] - wp[i]));
  }
  return worst;
}

}  // namespace

TEST(LogSoftmax, MatchesMlxForEveryIsa) {
  mx::random::seed(7);
  // One value, short rows, rows with tails of every length class, several chunks, a vocabulary.
  for (int V : {1, 5, 16, 63, 64, 65, 1000, 4096, 4097, 12345, 49152}) {
    for (int rows : {1, 3}) {
      mx::array x = mx::multiply(mx::random::normal({rows, V}), mx::array(4.0f));
      mx::eval(x);
      // The exact values, in double on the host: both float32 computations are held to them.
      std::vector<double> exact(x.size());
      const float* xp = x.data<float>();
      for (int r = 0; r < rows; ++r) {
        double m = -INFINITY, s = 0;
        for (int i = 0; i < V; ++i) m = std::max(m, static_cast<double>(xp[r * V + i]));
        for (int i = 0; i < V; ++i) s += std::exp(xp[r * V + i] - m);
        for (int i = 0; i < V; ++i) exact[r * V + i] = xp[r * V + i] - (m + std::log(s));
      }
      auto err = [&](const mx::array& y) {
        mx::eval(y);
        double worst = 0;
        for (size_t i = 0; i < y.size(); ++i)
          worst = std::max(worst, std::abs(y.data<float>()[i] - exact[i]));
        return worst;
      };
      const double mlx_err = err(kc::log_softmax_reference(x));
      for (kc::Isa isa : {kc::Isa::generic, kc::Isa::avx2, kc::Isa::avx512}) {
        if (!kc::isa_available(isa)) continue;
        mx::array got = kc::log_softmax(x, isa);
        // Within float32 rounding of the largest |value| (about 2^5 here) plus the error of a
        // float32 sum of V terms, and never much worse than MLX's own.
        const double e = err(got);
        EXPECT_LT(e, 1e-5 + 1e-9 * V) << "V " << V << " rows " << rows << " " << kc::isa_name(isa);
        EXPECT_LT(e, 2 * mlx_err + 1e-5) << "V " << V << " " << kc::isa_name(isa);
        EXPECT_LT(max_abs_diff(got, kc::log_softmax_reference(x)), 2e-4f);
      }
    }
  }
}

TEST(LogSoftmax, MaskedEntriesAndOtherDtypes) {
  mx::random::seed(8);
  const int V = 9000;
  mx::array x = mx::random::normal({2, V});
  // -inf entries (a constraint's mask) everywhere but a few; a whole chunk of them in row 1.
  std::vector<float> mask(2 * static_cast<size_t>(V), 0.0f);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < V; ++i) {
    if (i % 7 != 0) mask[i] = neg_inf;
    if (i < 2 * kc::kLogSoftmaxChunk) mask[V + i] = neg_inf;
  }
  x = mx::add(x, mx::array(mask.data(), {2, V}));
  EXPECT_LT(max_abs_diff(kc::log_softmax(x), kc::log_softmax_reference(x)), 2e-5f);
  for (mx::Dtype t : {mx::bfloat16, mx::float16}) {
    mx::array xt = mx::astype(mx::random::normal({2, 3000}), t);
    mx::array got = kc::log_softmax(xt);
    EXPECT_EQ(got.dtype(), t);
    // Against the float32 computation rounded once to t: within one rounding of t.
    mx::array want = kc::log_softmax_reference(mx::astype(xt, mx::float32));
    const float ulp = t == mx::bfloat16 ? 1.0f / 128 : 1.0f / 1024;
    mx::array rel = mx::max(mx::divide(mx::abs(mx::subtract(mx::astype(got, mx::float32), want)),
                                       mx::maximum(mx::abs(want), mx::array(1.0f))));
    EXPECT_LE(rel.item<float>(), ulp) << t;
  }
  // A row of only -inf: NaN, as the MLX computation gives.
  mx::array all = mx::full({1, 100}, neg_inf);
  EXPECT_TRUE(mx::all(mx::isnan(kc::log_softmax_reference(all))).item<bool>());
  EXPECT_TRUE(mx::all(mx::isnan(kc::log_softmax(all))).item<bool>());
}

TEST(LogSoftmax, StridedInputAndRepeatability) {
  mx::random::seed(9);
  mx::array x3 = mx::random::normal({2, 5, 7000});
  // The token loop's input: the last position of (B, L, V), a strided view.
  mx::array last = mx::reshape(mx::slice(x3, {0, 4, 0}, {2, 5, 7000}), {2, 7000});
  mx::array a = kc::log_softmax(last), b = kc::log_softmax(last);
  EXPECT_LT(max_abs_diff(a, kc::log_softmax_reference(last)), 2e-5f);
  EXPECT_TRUE(mx::array_equal(a, b).item<bool>());
}

TEST(LogSoftmax, BadInputIsAnError) {
  EXPECT_THROW(kc::log_softmax(mx::zeros({2, 3}, mx::int32)), lmx::Error);
  EXPECT_THROW(kc::log_softmax(mx::zeros({2, 0})), lmx::Error);
}
