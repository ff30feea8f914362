#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace lmx::kernels::cpu {

namespace {

int configured_threads() {
  if (const char* env = std::getenv("LMX_CPU_THREADS"); env && *env) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    check(*end == '\0' && n >= 1 && n <= 256, "LMX_CPU_THREADS",
          "expected a thread count from 1 to 256, got '", env, "'");
    return static_cast<int>(n);
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

class Pool {
 public:
  explicit Pool(int n) : size_(n), slots_(n) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { work(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return size_; }

  void run(int n_tasks, const std::function<void(int)>& fn) {
    std::lock_guard<std::mutex> call(call_mu_);
    if (size_ == 1 || n_tasks <= 1) {
      for (int i = 0; i < n_tasks; ++i) fn(i);
      return;
    }
    {
      std::unique_lock<std::mutex> lk(mu_);
      done_cv_.wait(lk, [&] { return active_ == 0; });  // a late joiner of the previous call
      fn_ = &fn;
      n_tasks_ = n_tasks;
      for (int p = 0; p < size_; ++p) {
        slots_[p].next.store(static_cast<int>(static_cast<long>(n_tasks) * p / size_));
        slots_[p].end = static_cast<int>(static_cast<long>(n_tasks) * (p + 1) / size_);
      }
      done_.store(0);
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    cv_.notify_all();
    drain(&fn, n_tasks, 0);
    // Spin briefly (the tasks are short) until the tasks are done and the workers have left the
    // call, then sleep: waiting on the condition variable for a worker still on its way out
    // costs a futex sleep and wake-up, ~100 times a decode step.
    for (int spin = 0; spin < 20000 && (done_.load(std::memory_order_acquire) < n_tasks ||
                                        active_.load(std::memory_order_acquire) != 0);
         ++spin) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    // Every worker that joined this call must have left it before its state is reused.
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return done_.load() >= n_tasks_ && active_ == 0; });
    fn_ = nullptr;
  }

 private:
  // Participant p runs the tasks of its own contiguous range first, in order, then those left in
  // the others' ranges: each thread streams adjacent weight rows, so the prefetch of the rows
  // after a task's last block serves the same thread's next task.
  void drain(const std::function<void(int)>* fn, int n, int p) {
    if (!fn) return;
    for (int q = 0; q < size_; ++q) {
      Slot& s = slots_[(p + q) % size_];
      for (int i; (i = s.next.fetch_add(1)) < s.end;) {
        (*fn)(i);
        done_.fetch_add(1, std::memory_order_acq_rel);
      }
    }
  }

  void work(int p) {
    unsigned long seen = 0;
    const std::function<void(int)>* fn = nullptr;
    int n = 0;
    for (;;) {
      // A decode step makes a few hundred calls, microseconds apart: spin ~30 us for the next
      // one before sleeping, so most calls skip a futex wake-up.
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(30);
      while (published_.load(std::memory_order_acquire) == seen &&
             std::chrono::steady_clock::now() < until) {
        for (int i = 0; i < 16; ++i) {
#if defined(__x86_64__)
          __builtin_ia32_pause();
#endif
        }
      }
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        fn = fn_;
        n = n_tasks_;
        ++active_;
      }
      drain(fn, n, p);
      // The caller waits for done_ and active_ (spinning, then on done_cv_): the last worker out
      // notifies under the lock, so a caller that checked before the decrement is woken.
      if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(mu_);
        done_cv_.notify_all();
      }
    }
  }

  int size_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_, mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* fn_ = nullptr;
  int n_tasks_ = 0;
  std::atomic<int> active_{0};  // workers inside the current call (joined under mu_)
  // One per participant (the caller is 0), each on its own cache line.
  struct alignas(64) Slot {
    std::atomic<int> next{0};
    int end = 0;
  };
  std::vector<Slot> slots_;
  std::atomic<int> done_{0};
  unsigned long generation_ = 0;
  std::atomic<unsigned long> published_{0};  // generation_, readable without the lock
  bool stop_ = false;
};

Pool& pool() {
  static Pool p(configured_threads());
  return p;
}

}  // namespace

int num_threads() { return pool().size(); }

void parallel_for(int n_tasks, const std::function<void(int)>& fn) { pool().run(n_tasks, fn); }

}  // namespace lmx::kernels::cpu
