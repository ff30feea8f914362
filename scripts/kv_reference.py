"""Reference for lmx's RotatingQuantizedKVCache, built from mlx-lm's own pieces (mlx-lm 0.32.2 has
no quantized rotating cache: RotatingKVCache.to_quantized raises NotImplementedError).

RotatingQuantizedReference is mlx-lm's RotatingKVCache, unchanged, storing keys and values in
the activation dtype; update_and_fetch returns mx.quantize of what RotatingKVCache returns. Since
mx.quantize groups along head_dim, each row's triple depends on that row alone, so these are the
triples a ring of quantized rows holds. It has `bits` and `group_size`, so mlx-lm's
scaled_dot_product_attention takes its quantized path for it, as it does for QuantizedKVCache.

maybe_quantize_kv_cache mirrors mlx_lm.generate.maybe_quantize_kv_cache, converting
RotatingKVCache through to_rotating_quantized instead of raising, and applies per-layer entries
(kv_config.json: layer -> bits, group_size) from the first cached token, as mlx-bun does.
"""
import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache


class RotatingQuantizedReference(RotatingKVCache):
    def __init__(self, max_size, keep=0, group_size=64, bits=8):
        super().__init__(max_size=max_size, keep=keep)
        self.group_size, self.bits = group_size, bits

    def quantize(self, x):
        return mx.quantize(x, group_size=self.group_size, bits=self.bits)

    def update_and_fetch(self, keys, values):
        keys, values = super().update_and_fetch(keys, values)
        return self.quantize(keys), self.quantize(values)

    def quantized_state(self):
        """The stored buffers quantized: lmx's state() order (K triple, then V triple)."""
        return [*self.quantize(self.keys), *self.quantize(self.values)]

    def to_quantized(self, group_size=64, bits=4):
        return self  # already quantized (lmx's to_quantized returns nothing here)


def to_rotating_quantized(cache, group_size, bits):
    """What lmx's RotatingKVCache.to_quantized builds, as a reference object."""
    q = RotatingQuantizedReference(cache.max_size, cache.keep, group_size, bits)
    q.keys, q.values, q.offset, q._idx = cache.keys, cache.values, cache.offset, cache._idx
    return q


def maybe_quantize_kv_cache(cache, start, group_size, bits, kv_config=None):
    per_layer = {e["layer_idx"]: e for e in (kv_config or [])}
    if bits is None and not per_layer:
        return
    for i, c in enumerate(cache):
        if isinstance(c, RotatingQuantizedReference) or not hasattr(c, "to_quantized"):
            continue
        if i in per_layer:
            if c.offset == 0:
                continue
            gs, b = per_layer[i].get("group_size", 64), per_layer[i]["bits"]
        elif bits is not None and c.offset >= start:
            gs, b = group_size, bits
        else:
            continue
        if type(c) is RotatingKVCache:
            cache[i] = to_rotating_quantized(c, gs, b)
        else:
            cache[i] = c.to_quantized(group_size=gs, bits=b)
