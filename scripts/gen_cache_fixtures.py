#!/usr/bin/env python3
"""mlx-lm KV-cache reference runs (models/cache.py) on random keys and values.

Each scenario is a list of operations on one mlx-lm cache object: update_and_fetch with recorded
inputs and outputs (plain arrays, or quantized (packed, scales, biases) triples), make_mask,
trim, is_trimmable, to_quantized, rollback. tests/unit/test_caches.cpp replays them on lmx's
caches and requires identical outputs (every bit), offsets and ring positions.

Rotating quantized scenarios run on kv_reference.RotatingQuantizedReference (mlx-lm's
RotatingKVCache with mx.quantize of its outputs; mlx-lm has no such cache). A rollback op writes
L tokens to lmx's cache and trims the last n with bypass; the reference cache receives only the
first L - n of them (as one multi-token write, the path a verify step takes), and the whole state
must then be identical, and so everything after.

usage: gen_cache_fixtures.py OUT_DIR
writes OUT_DIR/caches.json (the scenarios) and OUT_DIR/caches.safetensors (the arrays), and
OUT_DIR/prompt_cache.safetensors, a mixed prompt cache written by mlx-lm's save_prompt_cache,
and OUT_DIR/arrays_prompt_cache.safetensors, a hybrid model's (ArraysCache beside KVCache)
"""
import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import (ArraysCache, KVCache, QuantizedKVCache, RotatingKVCache,
                                 load_prompt_cache, save_prompt_cache)

from kv_reference import RotatingQuantizedReference, to_rotating_quantized

B, H = 1, 2


class Recorder:
    """Runs operations on a cache and records them with their results. D: head_dim."""

    def __init__(self, name, cache, spec, arrays, D, dtype=mx.bfloat16):
        self.name, self.cache, self.arrays, self.D, self.dtype = name, cache, arrays, D, dtype
        self.ops = []
        self.spec = spec

    def key(self, what):
        return f"{self.name}.{len(self.ops):04d}.{what}"

    def state(self):
        c = self.cache
        s = dict(offset=c.offset)
        if isinstance(c, RotatingKVCache):
            s["idx"] = c._idx
        return s

    def update(self, n, record=True):
        k = mx.random.normal((B, H, n, self.D)).astype(self.dtype)
        v = mx.random.normal((B, H, n, self.D)).astype(self.dtype)
        op = dict(op="update", length=n, inputs=self.key("in"), record=record)
        # The caches keep (and later assign into) the arrays they are given and return, so
        # everything recorded is a copy (mx.array(a) shares the data, not the later writes).
        self.arrays[op["inputs"] + ".keys"] = mx.array(k)
        self.arrays[op["inputs"] + ".values"] = mx.array(v)
        keys, values = self.cache.update_and_fetch(k, v)
        if record:
            op["outputs"] = self.key("out")
            if isinstance(keys, (tuple, list)):
                for i, (a, b) in enumerate(zip(keys, values)):
                    self.arrays[f"{op['outputs']}.keys.{i}"] = mx.array(a)
                    self.arrays[f"{op['outputs']}.values.{i}"] = mx.array(b)
            else:
                self.arrays[op["outputs"] + ".keys"] = mx.array(keys)
                self.arrays[op["outputs"] + ".values"] = mx.array(values)
        op.update(after=self.state())
        self.ops.append(op)
        mx.eval(keys, values)

    def mask(self, n, window=None):
        m = self.cache.make_mask(n, return_array=False, window_size=window)
        op = dict(op="mask", length=n, window=window)
        if m is None:
            op["mask"] = None
        elif isinstance(m, str):
            op["mask"] = m
        else:
            op["mask"] = "array"
            op["array"] = self.key("mask")
            self.arrays[op["array"]] = m
        self.ops.append(op)

    def trim(self, n):
        trimmable = self.cache.is_trimmable()
        self.ops.append(dict(op="is_trimmable", result=trimmable))
        if trimmable:
            self.ops.append(dict(op="trim", n=n, result=self.cache.trim(n), after=self.state()))

    def rollback(self, n_write, n_trim):
        k = mx.random.normal((B, H, n_write, self.D)).astype(self.dtype)
        v = mx.random.normal((B, H, n_write, self.D)).astype(self.dtype)
        op = dict(op="rollback", length=n_write, n=n_trim, inputs=self.key("in"),
                  state=self.key("state"))
        self.arrays[op["inputs"] + ".keys"] = mx.array(k)
        self.arrays[op["inputs"] + ".values"] = mx.array(v)
        kept = n_write - n_trim
        k, v = k[:, :, :kept], v[:, :, :kept]
        # A one-token remainder still went through the multi-token (concat) path in lmx.
        write = self.cache._update_concat if kept == 1 else self.cache.update_and_fetch
        fetched = write(k, v)
        mx.eval(fetched)
        c = self.cache
        state = (c.quantized_state() if isinstance(c, RotatingQuantizedReference)
                 else [c.keys, c.values])
        for i, a in enumerate(state):
            self.arrays[f"{op['state']}.{i}"] = mx.array(a)
        op.update(parts=len(state), after=self.state())
        self.ops.append(op)

    def to_quantized(self, group_size, bits):
        if type(self.cache) is RotatingKVCache:
            self.cache = to_rotating_quantized(self.cache, group_size, bits)
        else:
            self.cache = self.cache.to_quantized(group_size=group_size, bits=bits)
        self.ops.append(dict(op="to_quantized", group_size=group_size, bits=bits,
                             after=self.state()))

    def result(self):
        return dict(name=self.name, cache=self.spec, ops=self.ops)


def rotating_long(arrays, name, keep, chunks, window_masks):
    """Prefill 300 in chunks, then 200 single-token steps, window 64; masks before each write.
    Outputs are recorded for every prefill chunk, the first 70 steps (the ring wraps in them
    when the prefill was short) and every 8th step after; offsets for all."""
    r = Recorder(name, RotatingKVCache(max_size=64, keep=keep),
                 dict(type="RotatingKVCache", max_size=64, keep=keep), arrays, D=16)
    for n in chunks:
        for w in window_masks:
            r.mask(n, w)
        r.update(n)
    for step in range(200):
        for w in window_masks:
            r.mask(1, w)
        r.update(1, record=step < 70 or step % 8 == 7)
    return r.result()


def rotating_trim(arrays):
    """Trim before the ring wraps (single- and multi-token writes around it); none after."""
    r = Recorder("rotating_trim", RotatingKVCache(max_size=64),
                 dict(type="RotatingKVCache", max_size=64, keep=0), arrays, D=16)
    r.update(40)
    for _ in range(5):
        r.update(1)
    r.trim(7)
    for _ in range(3):
        r.update(1)
    r.update(10)
    r.trim(4)
    r.update(1)
    r.update(20)  # offset 48 -> 68: past max_size
    r.trim(3)  # not trimmable any more
    r.update(1)
    r.mask(5)
    r.mask(1, 64)
    return r.result()


def rotating_quantized_long(arrays, keep, chunks, group_size, bits):
    """RotatingQuantizedKVCache (reference: RotatingQuantizedReference), window 64: prefill 300
    in chunks, then 200 single-token steps, masks before each write."""
    name = f"rotating_quantized_b{bits}_g{group_size}_keep{keep}_{len(chunks)}chunks"
    spec = dict(type="RotatingQuantizedKVCache", max_size=64, keep=keep, group_size=group_size,
                bits=bits)
    r = Recorder(name, RotatingQuantizedReference(64, keep, group_size, bits), spec, arrays, D=64)
    for n in chunks:
        r.mask(n, 64)
        r.update(n)
    for step in range(200):
        r.mask(1, 48)
        r.update(1, record=step < 70 or step % 8 == 7)
    return r.result()


def rotating_to_quantized(arrays, group_size, bits):
    """RotatingKVCache converted mid-run (after the ring wrapped), then single- and multi-token
    writes on the quantized ring; plain trim is refused after the wrap like mlx-lm's."""
    name = f"rotating_to_quantized_b{bits}_g{group_size}"
    r = Recorder(name, RotatingKVCache(max_size=32, keep=2),
                 dict(type="RotatingKVCache", max_size=32, keep=2), arrays, D=64)
    r.update(20)
    for _ in range(15):  # wraps at offset 32
        r.update(1)
    r.to_quantized(group_size, bits)
    for _ in range(5):
        r.update(1)
    r.mask(6)
    r.update(6)
    r.trim(2)
    for _ in range(40):
        r.update(1)
    r.mask(1, 16)
    return r.result()


def rotating_rollback(arrays, quantized):
    """Speculative rollback (trim with bypass) before and past the window, after prefill chunks
    and after single-token steps, with one-token and longer remainders; then more writes."""
    name = "rollback_rotating_quantized" if quantized else "rollback_rotating"
    spec = dict(type="RotatingQuantizedKVCache" if quantized else "RotatingKVCache", max_size=16,
                keep=0)
    if quantized:
        spec.update(group_size=32, bits=4)
        cache = RotatingQuantizedReference(16, 0, 32, 4)
    else:
        cache = RotatingKVCache(max_size=16)
    r = Recorder(name, cache, spec, arrays, D=32)
    r.rollback(6, 2)  # first write, before the window
    r.update(1)
    r.rollback(5, 4)  # one token kept
    for _ in range(12):  # wraps
        r.update(1)
    r.rollback(8, 3)  # past the window, after ring-order single-token writes
    r.mask(1, 16)
    r.update(1)
    r.update(1)
    r.rollback(4, 3)
    r.rollback(20, 7)  # right after the previous rollback
    r.mask(4)
    r.update(4)
    r.rollback(3, 1)
    for _ in range(18):
        r.mask(1, 16)
        r.update(1)
    return r.result()


def quantized(arrays, group_size, bits):
    """QuantizedKVCache: prefill 300 (two chunks) + 20 steps, trim, more steps."""
    name = f"quantized_b{bits}_g{group_size}"
    r = Recorder(name, QuantizedKVCache(group_size=group_size, bits=bits),
                 dict(type="QuantizedKVCache", group_size=group_size, bits=bits), arrays, D=64)
    r.update(256)
    r.update(44)
    for step in range(20):
        r.update(1, record=step < 2 or step == 19)
    r.trim(5)
    r.mask(3)
    r.mask(1)
    r.mask(4, 16)
    for _ in range(3):
        r.update(1)
    return r.result()


def kv_to_quantized(arrays, group_size, bits):
    """KVCache filled, then to_quantized (the padded buffer quantized whole), then updates."""
    name = f"to_quantized_b{bits}_g{group_size}"
    r = Recorder(name, KVCache(), dict(type="KVCache"), arrays, D=64)
    r.update(100)
    r.update(1)
    r.to_quantized(group_size, bits)
    for _ in range(4):
        r.update(1)
    r.update(160)  # crosses the 256 step
    return r.result()


def prompt_cache(out, arrays):
    """A mixed prompt cache saved by mlx-lm's save_prompt_cache, loaded back with
    load_prompt_cache, and one more single-token write on every loaded cache."""

    def kv(n, D=64):
        k = mx.random.normal((B, H, n, D)).astype(mx.bfloat16)
        return k, mx.random.normal((B, H, n, D)).astype(mx.bfloat16)

    caches = [KVCache(), RotatingKVCache(16, keep=2), RotatingKVCache(16), KVCache(),
              QuantizedKVCache(group_size=32, bits=8), KVCache()]
    caches[0].update_and_fetch(*kv(20))
    caches[1].update_and_fetch(*kv(10))
    for _ in range(10):  # wraps: offset 20 > 16
        caches[1].update_and_fetch(*kv(1))
    caches[2].update_and_fetch(*kv(5))
    caches[4].update_and_fetch(*kv(7))
    caches[5].update_and_fetch(*kv(3))
    caches[5] = caches[5].to_quantized(group_size=64, bits=4)
    metadata = {"model": "tiny", "tokens": "20"}
    save_prompt_cache(str(out / "prompt_cache.safetensors"), caches, metadata)
    loaded = load_prompt_cache(str(out / "prompt_cache.safetensors"))
    steps = []
    for i, c in enumerate(loaded):
        k, v = kv(1)
        key = f"prompt_cache.{i}"
        arrays[f"{key}.in.keys"], arrays[f"{key}.in.values"] = mx.array(k), mx.array(v)
        keys, values = c.update_and_fetch(k, v)
        quantized = isinstance(keys, (tuple, list))
        for name, got in (("keys", keys), ("values", values)):
            for j, a in enumerate(got if quantized else [got]):
                arrays[f"{key}.out.{name}.{j}"] = mx.array(a)
        after = dict(offset=c.offset)
        if isinstance(c, RotatingKVCache):
            after["idx"] = c._idx
        steps.append(dict(cls=type(c).__name__, quantized=quantized, after=after))
    return dict(file="prompt_cache.safetensors", metadata=metadata, steps=steps)


def arrays_prompt_cache(out):
    """A hybrid model's prompt cache as mlx-lm saves it: a linear-attention ArraysCache (conv
    state bf16 (1, 3, 192), recurrent state f32 (1, 4, 16, 32)) after 7 tokens, an empty one, and
    a KVCache of 7 tokens."""
    filled, empty, kv = ArraysCache(size=2), ArraysCache(size=2), KVCache()
    filled[0] = mx.random.normal((1, 3, 192)).astype(mx.bfloat16)
    filled[1] = mx.random.normal((1, 4, 16, 32))
    filled.advance(7)
    kv.update_and_fetch(mx.random.normal((B, H, 7, 32)).astype(mx.bfloat16),
                        mx.random.normal((B, H, 7, 32)).astype(mx.bfloat16))
    metadata = {"model": "hybrid"}
    save_prompt_cache(str(out / "arrays_prompt_cache.safetensors"), [filled, empty, kv], metadata)
    return dict(file="arrays_prompt_cache.safetensors", metadata=metadata, offset=7)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    mx.set_default_device(mx.cpu)
    mx.random.seed(4321)
    arrays = {}
    scenarios = [
        rotating_long(arrays, "rotating_w64_chunked", 0, [128, 128, 44], [None, 64, 48]),
        rotating_long(arrays, "rotating_w64_keep4_oneshot", 4, [300], [None, 64, 48]),
        rotating_long(arrays, "rotating_w64_short_prefill", 0, [5, 20], [None, 64, 48]),
        rotating_trim(arrays),
    ]
    for bits in (4, 8):
        for group_size in (32, 64):
            scenarios.append(quantized(arrays, group_size, bits))
    scenarios += [
        rotating_quantized_long(arrays, 0, [128, 128, 44], 32, 4),
        rotating_quantized_long(arrays, 4, [300], 64, 8),
        rotating_quantized_long(arrays, 0, [7], 64, 4),
        rotating_to_quantized(arrays, 64, 4),
        rotating_to_quantized(arrays, 32, 8),
        rotating_rollback(arrays, quantized=False),
        rotating_rollback(arrays, quantized=True),
    ]
    scenarios.append(kv_to_quantized(arrays, 64, 4))
    scenarios.append(kv_to_quantized(arrays, 32, 8))
    pc = prompt_cache(out, arrays)
    apc = arrays_prompt_cache(out)
    mx.save_safetensors(str(out / "caches.safetensors"), arrays, metadata={"format": "mlx"})
    (out / "caches.json").write_text(
        json.dumps(dict(scenarios=scenarios, prompt_cache=pc, arrays_prompt_cache=apc), indent=1)
        + "\n")
    size = (out / "caches.safetensors").stat().st_size
    print(f"gen_cache_fixtures: {len(scenarios)} scenarios, {len(arrays)} arrays, "
          f"{size / 1e6:.1f} MB in {out}")


if __name__ == "__main__":
    sys.exit(main())
