#!/usr/bin/env python3
"""mlx-lm sampler and logits-processor reference outputs (sample_utils.py) on random inputs.

For each case: the input log-probabilities, each filter's output (top-p, min-p, top-k), the
tokens drawn by make_sampler(...) after mx.random.seed(seed), and the logits processors' output
for a token history. tests/unit/test_sampler.cpp requires identical results.

usage: gen_sampler_fixtures.py OUT_DIR
"""
import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.sample_utils import (apply_min_p, apply_top_k, apply_top_p, make_logits_processors,
                                 make_sampler)

SAMPLERS = [
    {"temp": 0.0},
    {"temp": 0.7},
    {"temp": 1.0, "top_p": 0.9},
    {"temp": 0.8, "top_k": 20},
    {"temp": 1.2, "min_p": 0.05},
    {"temp": 1.0, "min_p": 0.2, "min_tokens_to_keep": 5},
    {"temp": 0.6, "top_p": 0.95, "min_p": 0.02, "top_k": 40},
]
PROCESSORS = [
    {"repetition_penalty": 1.3},
    {"repetition_penalty": 0.8, "repetition_context_size": 5},
    {"presence_penalty": 0.5},
    {"frequency_penalty": 0.25, "frequency_context_size": 12},
    {"logit_bias": {3: 2.5, 17: -1.0}},
    {"repetition_penalty": 1.1, "presence_penalty": 0.3, "frequency_penalty": 0.2,
     "logit_bias": {5: 1.0}},
]
DRAWS = 16


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    arrays, meta = {}, {"samplers": [], "processors": []}
    for dtype_name, dtype in (("float32", mx.float32), ("bfloat16", mx.bfloat16)):
        mx.random.seed(1234)
        logits = (mx.random.normal((1, 300)) * 3).astype(dtype)
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        arrays[f"{dtype_name}.logprobs"] = logprobs
        arrays[f"{dtype_name}.top_p"] = apply_top_p(logprobs, 0.9)
        arrays[f"{dtype_name}.min_p"] = apply_min_p(logprobs, 0.05)
        arrays[f"{dtype_name}.min_p_keep"] = apply_min_p(logprobs, 0.5, 7)
        arrays[f"{dtype_name}.top_k"] = apply_top_k(logprobs, 10)
        for i, cfg in enumerate(SAMPLERS):
            sampler = make_sampler(**cfg)
            mx.random.seed(42 + i)
            tokens = [sampler(logprobs).item() for _ in range(DRAWS)]
            meta["samplers"].append({"dtype": dtype_name, "options": cfg, "seed": 42 + i,
                                     "tokens": tokens})
        history = mx.array([3, 7, 7, 42, 5, 99, 3, 250, 7, 17, 60, 61, 62, 63, 64, 3], mx.int32)
        for i, cfg in enumerate(PROCESSORS):
            # The processors assign into their input (logits[:, ids] = ...): give each a copy.
            x = mx.array(logits)
            for proc in make_logits_processors(**cfg):
                x = proc(history, x)
            arrays[f"{dtype_name}.processed_{i}"] = x
            meta["processors"].append({"dtype": dtype_name, "index": i, "history": history.tolist(),
                                       "options": {k: ({str(a): b for a, b in v.items()}
                                                       if isinstance(v, dict) else v)
                                                   for k, v in cfg.items()}})
        arrays[f"{dtype_name}.logits"] = logits
    mx.save_safetensors(str(out / "sampler.safetensors"), arrays)
    (out / "sampler.json").write_text(json.dumps(meta, indent=1))
    print(f"sampler fixtures -> {out}")


if __name__ == "__main__":
    main()
