// Tier L3 of a CUDA build for the batched forward on this thread: the scheduler sets it around a
// forward over a row view (as nn::RouteGuard sets the adapters), and nn::cached_attention then
// takes the CUDA rows attention kernel (kernels/cuda/rows_attention.h) for decode steps over
// plain caches. The CPU's tier L3 is the row view's own flag (RowsKVCache::cpu_kernels).
#pragma once

namespace lmx::nn {

class CudaRowsGuard {
 public:
  explicit CudaRowsGuard(bool on);
  ~CudaRowsGuard();
  CudaRowsGuard(const CudaRowsGuard&) = delete;
  CudaRowsGuard& operator=(const CudaRowsGuard&) = delete;

 private:
  bool prev_;
};

// Whether a CudaRowsGuard(true) is active on this thread.
bool cuda_rows_kernel();

}  // namespace lmx::nn
