// The rank side of tensor parallelism: joining the group launch_ranks started (lmx.h).
#pragma once

#include <string>

#include "models/model.h"

namespace lmx {

// In a process started by launch_ranks: initializes MLX distributed (ring on CPU, NCCL on CUDA)
// and checks the group has `size` ranks. Throws lmx::Error outside such a process.
ShardSpec join_tensor_parallel_group(int size);

// Collective (every rank of `group` must call it): returns rank 0's payload on every rank, sent
// as an all_sum of int32 words to which the other ranks add zeros. What lets ranks > 0 follow
// rank 0's requests (lmx serve --tp).
std::string broadcast_from_rank0(const std::string& payload, const mx::distributed::Group& group);

}  // namespace lmx
