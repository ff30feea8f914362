// parallel_for: every task runs exactly once, whatever the task count against the pool's
// threads, across back-to-back calls and calls from several threads at once.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace kc = lmx::kernels::cpu;

namespace {

// Runs parallel_for(n) and returns how often each task ran.
std::vector<int> run_counts(int n) {
  std::vector<std::atomic<int>> hits(n);
  kc::parallel_for(n, [&](int t) { hits[t].fetch_add(1); });
  std::vector<int> out(n);
  for (int i = 0; i < n; ++i) out[i] = hits[i].load();
  return out;
}

TEST(ThreadPool, EveryTaskRunsOnce) {
  // Fewer tasks than threads, one each, uneven splits, many.
  for (int n : {0, 1, 2, 3, 5, 7, 16, 101, 1000, 4099})
    for (int rep = 0; rep < 20; ++rep) {
      const std::vector<int> counts = run_counts(n);
      for (int t = 0; t < n; ++t) ASSERT_EQ(counts[t], 1) << "task " << t << " of " << n;
    }
}

TEST(ThreadPool, CallsFromSeveralThreads) {
  std::atomic<int> bad{0};
  std::vector<std::thread> callers;
  callers.reserve(3);
  for (int c = 0; c < 3; ++c)
    callers.emplace_back([&, c] {
      for (int rep = 0; rep < 50; ++rep) {
        const std::vector<int> counts = run_counts(37 + 13 * c + rep);
        for (int v : counts)
          if (v != 1) bad.fetch_add(1);
      }
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(ThreadPool, ResultsAreVisibleWhenTheCallReturns) {
  // A task's side effects are visible to the caller once parallel_for returns.
  std::vector<long> sums(64, 0);
  for (int rep = 0; rep < 100; ++rep) {
    kc::parallel_for(64, [&](int t) {
      long s = 0;
      for (int i = 0; i <= t * 100; ++i) s += i;
      sums[t] = s;
    });
    for (int t = 0; t < 64; ++t) {
      const long n = t * 100L;
      ASSERT_EQ(sums[t], n * (n + 1) / 2) << t;
    }
    std::fill(sums.begin(), sums.end(), 0);
  }
}

}  // namespace
