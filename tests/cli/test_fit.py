#!/usr/bin/env python3
"""lmx fit against mlx-lm: for tiny models of each cache layout, the weights' bytes are the sum of
the tensors mx.load reads from model*.safetensors, and the KV bytes at a context are those of the
caches mlx_lm's own model fills (make_prompt_cache, one token per step), measured from the cache
arrays' shapes and dtypes: full caches, sliding-window layers (RotatingKVCache), gemma3's pattern,
gemma4's KV-shared layers and wide global heads, the multimodal wrappers, GQA, explicit head_dim,
quantized weights and quantized KV (KVCache.to_quantized). The largest context it reports fits
and one more token does not (exit status 0 and 3).

    LMX_BINARY=build/lmx LMX_TEST_DATA=build/testdata .venv/bin/python tests/cli/test_fit.py
"""
import json
import os
import subprocess
import unittest
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache, make_prompt_cache
from mlx_lm.utils import load_model

LMX = os.environ["LMX_BINARY"]
PARITY = Path(os.environ["LMX_TEST_DATA"]) / "parity"

# (fixture, what its cache layout exercises)
MODELS = [
    ("llama_f16", "full caches, float16"),
    ("llama_gqa1", "one KV head"),
    ("llama_head_dim", "head_dim apart from hidden_size / heads"),
    ("llama_layer_types_window8", "layer_types sliding_attention, window 8"),
    ("llama_q4_g64", "4-bit weights: the cache in the scales' dtype"),
    ("qwen3_f32", "qwen3, float32"),
    ("qwen3_moe_f32", "qwen3 MoE"),
    ("gemma2", "gemma2: full caches everywhere"),
    ("gemma3_text_window8", "gemma3 pattern, window 8"),
    ("gemma3_kv4_g32_wrapper", "gemma3 multimodal wrapper (text_config)"),
    ("gemma4_text_ple", "gemma4: KV-shared layers, global_head_dim"),
    ("gemma4_wrapper", "gemma4 wrapper"),
    ("gemma4_moe_f32", "gemma4 MoE"),
    ("starcoder2_tied", "starcoder2"),
    ("phi3_f32_q4_g64", "phi3 fused qkv"),
]


def lmx_fit(model, *args):
    p = subprocess.run([LMX, "fit", "--model", str(model), "--json", *args], capture_output=True,
                       text=True, timeout=120)
    if p.returncode not in (0, 3):
        raise AssertionError(f"lmx fit failed ({p.returncode}): {p.stderr}")
    return p.returncode, json.loads(p.stdout)


def safetensors_bytes(model):
    total = 0
    for f in sorted(model.glob("model*.safetensors")):
        total += sum(a.nbytes for a in mx.load(str(f)).values())
    return total


def filled_caches(model, tokens):
    net, _ = load_model(model)
    cache = make_prompt_cache(net)
    for t in range(tokens):
        net(mx.array([[(7 * t + 3) % 64]]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def held_bytes(c):
    """Bytes of the tokens a cache holds (its buffers grow in steps of 256 tokens)."""
    if isinstance(c, QuantizedKVCache):
        return sum(a[..., : c.offset, :].nbytes for part in (c.keys, c.values) for a in part)
    if isinstance(c, RotatingKVCache):
        n = min(c.offset, c.max_size)
    elif isinstance(c, KVCache):
        n = c.offset
    else:
        raise AssertionError(f"unexpected cache type {type(c).__name__}")
    return c.keys[..., :n, :].nbytes + c.values[..., :n, :].nbytes


class FitAgainstMlxLm(unittest.TestCase):
    def test_weights_and_kv_bytes(self):
        for name, what in MODELS:
            model = PARITY / name
            with self.subTest(model=name, layout=what):
                self.assertTrue((model / "config.json").exists(), f"missing fixture {model}")
                for ctx in (5, 21):
                    _, got = lmx_fit(model, "--ctx", str(ctx), "--budget", "100")
                    self.assertEqual(got["weights_bytes"], safetensors_bytes(model))
                    cache = filled_caches(model, ctx)
                    want = sum(held_bytes(c) for c in cache)
                    self.assertEqual(got["kv_bytes"], want, f"ctx {ctx}")
                    self.assertEqual(len(got["kv_layers"]), len(cache))

    def test_quantized_kv(self):
        # Head dims 64 (llama_kv4_g64), 32 (qwen3_q4_kv4_g32, llama_head_dim) and 32 over 8 KV heads.
        for name, cases in (("llama_kv4_g64", ((4, 64), (8, 32), (2, 32))),
                            ("qwen3_q4_kv4_g32", ((4, 32), (6, 32))),
                            ("llama_head_dim", ((8, 32),)),
                            ("llama_kv8_g32_gqa1", ((8, 32), (3, 32)))):
            for bits, group in cases:
                with self.subTest(model=name, bits=bits, group=group):
                    model = PARITY / name
                    _, got = lmx_fit(model, "--ctx", "13", "--budget", "100", "--kv-bits",
                                     str(bits), "--kv-group-size", str(group))
                    cache = [c.to_quantized(group_size=group, bits=bits)
                             for c in filled_caches(model, 13)]
                    self.assertEqual(got["kv_bytes"], sum(held_bytes(c) for c in cache))

    def test_largest_context_is_the_edge(self):
        model = PARITY / "llama_f16"
        _, at1k = lmx_fit(model, "--ctx", "1000", "--budget", "100")
        # A budget between 100 and 1000 tokens' worth: the edge lies inside.
        budget_gb = (at1k["weights_bytes"] + at1k["kv_bytes"] // 3) / 1e9
        rc, r = lmx_fit(model, "--budget", f"{budget_gb:.9f}", "--ctx", "100000")
        self.assertEqual(rc, 3)
        self.assertFalse(r["fits"])
        largest = r["largest_context"]
        self.assertGreater(largest, 1)
        self.assertLess(largest, 100000)
        rc, r = lmx_fit(model, "--budget", f"{budget_gb:.9f}", "--ctx", str(largest))
        self.assertEqual(rc, 0)
        self.assertLessEqual(r["total_bytes"], r["budget_bytes"])
        rc, r = lmx_fit(model, "--budget", f"{budget_gb:.9f}", "--ctx", str(largest + 1))
        self.assertEqual(rc, 3)
        self.assertGreater(r["total_bytes"], r["budget_bytes"])

    def test_text_output_and_bad_input(self):
        p = subprocess.run([LMX, "fit", "--model", str(PARITY / "gemma4_text_ple"), "--ctx", "64",
                            "--budget", "0.000001"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn("does not fit: needs", p.stdout)
        self.assertIn("4 with a KV cache", p.stdout)
        p = subprocess.run([LMX, "fit", "--model", str(PARITY / "llama_f16"), "--kv-bits", "7"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn("--kv-bits must be 2-6 or 8, got 7", p.stderr)
        p = subprocess.run([LMX, "fit", "--model", "/nonexistent/model"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn("/nonexistent/model", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
