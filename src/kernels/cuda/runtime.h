// What lmx's CUDA primitives share (kernels/cuda/qmm.cpp defines it): CUDA builds only.
#pragma once

#include <cuda.h>
#include <mlx/backend/cuda/device.h>
#include <mlx/mlx.h>

namespace lmx::kernels::cuda::detail {

namespace mx = mlx::core;

// An error naming the driver call when r is not CUDA_SUCCESS.
void check_cu(CUresult r, const char* what);

// Device memory for a primitive's output. MLX's stream-ordered allocator is internal to libmlx:
// these buffers come from lmx's own cache and go back to it when their array dies (MLX keeps an
// array used by a graph alive until the graph completes).
mx::allocator::Data device_buffer(size_t nbytes, int device, CUstream stream);

// x itself when row-contiguous, else a dense copy made on the encoder's stream (kept alive until
// the graph completes; 2- or 4-byte elements, at most 8 dims).
mx::array dense_input(const mx::array& x, mx::cu::CommandEncoder& enc);

}  // namespace lmx::kernels::cuda::detail
