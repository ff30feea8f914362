// The rank side of tensor parallelism: joining the group launch_ranks started (lmx.h).
#pragma once

#include "models/model.h"

namespace lmx {

// In a process started by launch_ranks: initializes MLX distributed (ring on CPU, NCCL on CUDA)
// and checks the group has `size` ranks. Throws lmx::Error outside such a process.
ShardSpec join_tensor_parallel_group(int size);

}  // namespace lmx
