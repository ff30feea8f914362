// A persistent pool of worker threads for the CPU kernels: created once, sized to the cores
// (LMX_CPU_THREADS overrides), so a kernel call costs a wake-up, not thread creation.
#pragma once

#include <functional>

namespace lmx::kernels::cpu {

// Threads that run a parallel_for, the calling thread included.
int num_threads();

// Calls fn(task) once for every task in [0, n_tasks), spread over the pool and the calling
// thread; returns when all are done. Thread p of T first runs the tasks of [n p / T, n (p + 1) /
// T) in order, then helps with what is left of the others'. Calls from several threads run one
// after another.
void parallel_for(int n_tasks, const std::function<void(int)>& fn);

}  // namespace lmx::kernels::cpu
