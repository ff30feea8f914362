#!/usr/bin/env python3
"""mlx-lm side of the GPU benchmark: mlx_lm.benchmark's measurement (random prompt, EOS ignored,
one warm-up, mean of trials over stream_generate's prompt_tps / generation_tps, or batch_generate
for batch > 1), for several workloads on one load. Prints one JSON line per workload.

usage: mlx_lm_bench.py MODEL_DIR --workloads P:G[:B],... [-n TRIALS]
"""
import argparse
import json

import mlx.core as mx
from mlx_lm import batch_generate, load, stream_generate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--workloads", required=True)
    ap.add_argument("-n", "--num-trials", type=int, default=2)
    a = ap.parse_args()
    mx.random.seed(0)
    model, tokenizer, config = load(a.model, return_config=True)
    tokenizer._eos_token_ids = {}
    vocab = config.get("vocab_size") or config["text_config"]["vocab_size"]
    for w in a.workloads.split(","):
        p, g, *b = (int(x) for x in w.split(":"))
        b = b[0] if b else 1
        prompts = mx.random.randint(0, vocab, (b, p)).tolist()

        def bench():
            if b > 1:
                return batch_generate(model, tokenizer, prompts, max_tokens=g).stats
            for r in stream_generate(model, tokenizer, prompts[0], max_tokens=g):
                pass
            return r

        bench()
        rs = [bench() for _ in range(a.num_trials)]
        avg = lambda k: sum(getattr(r, k) for r in rs) / len(rs)  # noqa: E731
        print(json.dumps({"runtime": "mlx-lm", "model": a.model, "prompt_tokens": p,
                          "gen_tokens": g, "batch": b, "prompt_tps": avg("prompt_tps"),
                          "generation_tps": avg("generation_tps"),
                          "peak_memory_gb": avg("peak_memory")}), flush=True)


if __name__ == "__main__":
    main()
