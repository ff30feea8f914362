#include "nn/shard.h"

#include "core/error.h"

namespace lmx::nn {

namespace {

constexpr const char* kWhere = "tensor parallel";

// _split(x, N, axis)[rank], made contiguous as mlx.nn's _shard does.
mx::array part(const mx::array& x, const ShardSpec& s, int axis, const std::string& name) {
  const int ax = axis < 0 ? axis + static_cast<int>(x.ndim()) : axis;
  const int n = x.shape(ax);
  check(n % s.size == 0, kWhere, "tensor '", name, "' has ", n, " entries on axis ", ax,
        ", which do not split into ", s.size, " equal parts");
  mx::Shape start(x.ndim(), 0), stop = x.shape();
  start[ax] = n / s.size * s.rank;
  stop[ax] = n / s.size * (s.rank + 1);
  return mx::contiguous(mx::slice(x, start, stop));
}

}  // namespace

mx::array AllReduce::operator()(const mx::array& partial) const {
  mx::array y = mx::distributed::all_sum(partial, group);
  return bias ? mx::add(y, *bias) : y;
}

Linear shard_all_to_sharded(const Linear& l, const ShardSpec& spec, const std::string& path) {
  Linear out = l;
  // Weights are 2-D: max(ndim - 2, 0) = axis 0, the output rows; the bias on its only axis.
  out.weight = part(l.weight, spec, 0, path + ".weight");
  if (l.scales) out.scales = part(*l.scales, spec, 0, path + ".scales");
  if (l.biases) out.biases = part(*l.biases, spec, 0, path + ".biases");
  if (l.bias) out.bias = part(*l.bias, spec, -1, path + ".bias");
  return out;
}

Linear shard_sharded_to_all(const Linear& l, const ShardSpec& spec, const std::string& path) {
  check(spec.group.has_value(), kWhere, "module '", path,
        "' is sharded-to-all but the shard spec has no distributed group");
  Linear out = l;
  out.weight = part(l.weight, spec, -1, path + ".weight");
  if (l.scales) out.scales = part(*l.scales, spec, -1, path + ".scales");
  if (l.biases) out.biases = part(*l.biases, spec, -1, path + ".biases");
  out.bias.reset();
  out.all_reduce = AllReduce{*spec.group, l.bias};
  return out;
}

void check_shardable(const DecoderOptions& o, const ShardSpec& spec, const std::string& source) {
  const int n = spec.size;
  check(n >= 1 && spec.rank >= 0 && spec.rank < n, kWhere, "rank ", spec.rank,
        " is outside a group of size ", n);
  auto divisible = [&](const char* key, int count) {
    check(count % n == 0, source, key, " ", count, " is not divisible by the tensor-parallel size ",
          n, ", expected a multiple of ", n);
  };
  divisible("num_attention_heads", o.attention.n_heads);
  divisible("num_key_value_heads", o.attention.n_kv_heads);
  divisible("intermediate_size", o.intermediate_size);
  // shard_block splits separate q/k/v and gate/up projections only.
  check(!o.attention.fused_qkv && !o.fused_gate_up, source,
        "tensor parallelism needs separate q/k/v and gate/up projections");
}

void shard_block(DecoderBlock& b, const ShardSpec& spec, const std::string& path) {
  Attention& a = b.self_attn;
  const std::string attn = path + ".self_attn", mlp = path + ".mlp";
  a.q_proj = shard_all_to_sharded(*a.q_proj, spec, attn + ".q_proj");
  a.k_proj = shard_all_to_sharded(*a.k_proj, spec, attn + ".k_proj");
  a.v_proj = shard_all_to_sharded(*a.v_proj, spec, attn + ".v_proj");
  a.o_proj = shard_sharded_to_all(a.o_proj, spec, attn + ".o_proj");
  a.opt.n_heads /= spec.size;
  a.opt.n_kv_heads /= spec.size;
  b.mlp.gate_proj = shard_all_to_sharded(*b.mlp.gate_proj, spec, mlp + ".gate_proj");
  b.mlp.down_proj = shard_sharded_to_all(b.mlp.down_proj, spec, mlp + ".down_proj");
  b.mlp.up_proj = shard_all_to_sharded(*b.mlp.up_proj, spec, mlp + ".up_proj");
}

}  // namespace lmx::nn
