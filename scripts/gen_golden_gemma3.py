#!/usr/bin/env python3
"""Golden outputs of mlx-lm on the real Gemma 3 270M (the Q4_K_M GGUF converted by lmx convert).

For each prompt: the prompt ids from mlx-lm's tokenizer, 128 greedy tokens of mlx-lm's
generate_step (EOS does not stop it, so every case compares the full length) and the
log-probabilities of the first steps. One prompt is longer than the 512-token sliding window, so
the rotating caches wrap during prefill. A third case runs that prompt again with 8-bit KV
caches (kv_bits 8, group 64, from the first token; 32 tokens): generate_step's
maybe_quantize_kv_cache is swapped for kv_reference's, which converts the sliding-window caches
into kv_reference.RotatingQuantizedReference where mlx-lm raises (see docs/testing.md).
tests/golden/test_golden_gemma3.cpp replays the prompt ids through lmx and requires identical
tokens and bit-identical log-probabilities.

usage: gen_golden_gemma3.py MODEL_DIR OUT_DIR [--max-tokens 128]
"""
import argparse
import json
from pathlib import Path

import importlib

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

import kv_reference

LONG = (
    "The lighthouse keeper wrote in his log every evening: the direction of the wind, the height "
    "of the waves, the ships that passed and the birds that rested on the gallery. "
)
# Gemma 3 270M is a base model: plain continuations. The second prompt (725 tokens) is longer
# than the sliding window.
PROMPTS = [
    "Once upon a time, there was a little",
    "Here is a diary:\n" + LONG * 20 + "\nIn summary, the keeper",
]
# (prompt index, max tokens or None for --max-tokens, generate_step's KV quantization or None)
CASES = [(0, None, None), (1, None, None),
         (1, 32, dict(kv_bits=8, kv_group_size=64, quantized_kv_start=0))]
LOGPROB_STEPS = 4


def reference_quantize(prompt_cache, quantized_kv_start, kv_group_size, kv_bits):
    """generate_step's maybe_quantize_kv_cache, with sliding-window caches converted."""
    kv_reference.maybe_quantize_kv_cache(prompt_cache, quantized_kv_start, kv_group_size, kv_bits)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mx.set_default_device(mx.cpu)

    # (the module: mlx_lm's package attribute `generate` is the function of that name)
    importlib.import_module("mlx_lm.generate").maybe_quantize_kv_cache = reference_quantize
    model, tokenizer = load(args.model)
    cases, arrays = [], {}
    for i, (p, max_tokens, kv) in enumerate(CASES):
        prompt = PROMPTS[p]
        ids = tokenizer.encode(prompt)
        tokens = []
        max_tokens = max_tokens or args.max_tokens
        for n, (tok, logprobs) in enumerate(
            generate_step(mx.array(ids), model, max_tokens=max_tokens, **(kv or {}))
        ):
            if n < LOGPROB_STEPS:
                arrays[f"case_{i}.logprobs_{n}"] = logprobs
            tokens.append(tok)
        cases.append(dict(prompt=prompt, prompt_ids=ids, tokens=tokens, max_tokens=max_tokens,
                          kv=kv, text=tokenizer.decode(tokens)))
        print(f"gen_golden_gemma3: case {i}: {len(ids)} prompt tokens, {len(tokens)} generated")
    mx.save_safetensors(str(out / "logprobs.safetensors"), arrays)
    meta = dict(max_tokens=args.max_tokens, logprob_steps=LOGPROB_STEPS, cases=cases)
    (out / "golden.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
