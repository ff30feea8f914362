// Tensor parallelism as mlx-lm's Model.shard does it with mlx.nn.shard_linear: q/k/v and
// gate/up all-to-sharded (each rank keeps its slice of the output rows), o_proj and down_proj
// sharded-to-all (each rank keeps its slice of the input columns, partial products all-summed).
// Embeddings, norms and the LM head stay whole on every rank.
#pragma once

#include <string>

#include "nn/transformer.h"

namespace lmx::nn {

// mlx.nn AllToShardedLinear.from_linear: weight, scales, zero points and bias split along the
// output axis into spec.size equal parts; this rank keeps part spec.rank.
Linear shard_all_to_sharded(const Linear& l, const ShardSpec& spec, const std::string& path);

// mlx.nn ShardedToAllLinear.from_linear: weight, scales and zero points split along the input
// (last) axis; the bias stays whole and is added after the all-sum.
Linear shard_sharded_to_all(const Linear& l, const ShardSpec& spec, const std::string& path);

// The head and MLP counts a size-way split needs, before any tensor is read.
void check_shardable(const DecoderOptions& o, const ShardSpec& spec, const std::string& source);

// llama.py / qwen2.py / qwen3.py Model.shard for one layer: heads and MLP columns split; the
// layer's KV cache then holds only this rank's kv heads.
void shard_block(DecoderBlock& block, const ShardSpec& spec, const std::string& path);

}  // namespace lmx::nn
