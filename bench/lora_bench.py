#!/usr/bin/env python3
"""The cost of a LoRA adapter in one run: `lmx bench` (tiers L3 and L1) with and without
`--adapter-path`, and mlx-lm with and without the adapter (mlx_lm.utils.load(path,
adapter_path=...), stream_generate on a random prompt, its own prompt / generation tokens/s,
one warm-up then the mean of the trials). Prints a Markdown table for docs/benchmarks.md.

usage: lora_bench.py --model DIR --adapter DIR [--lmx build/lmx] [-p 128] [-g 32] [-n 2]
"""
import argparse
import json
import subprocess
from pathlib import Path


def run_lmx(lmx, model, adapter, p, g, n, exact):
    cmd = [lmx, "bench", "--model", model, "--prompt-tokens", str(p), "--gen-tokens", str(g),
           "--trials", str(n), "--json"]
    if exact:
        cmd.append("--exact")
    if adapter:
        cmd += ["--adapter-path", adapter]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    j = json.loads(out.strip().splitlines()[-1])
    return j["prompt_tps"], j["generation_tps"]


def run_mlx_lm(model, adapter, p, g, n):
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import stream_generate

    m, tok = load(model, adapter_path=adapter)
    mx.random.seed(0)
    results = []
    for t in range(n + 1):
        prompt = mx.random.randint(0, tok.vocab_size, (p,)).tolist()
        last = None
        for last in stream_generate(m, tok, prompt, max_tokens=g):
            pass
        if t > 0:
            results.append((last.prompt_tps, last.generation_tps))
    return tuple(sum(r[i] for r in results) / len(results) for i in range(2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--lmx", default=str(Path(__file__).resolve().parents[1] / "build" / "lmx"))
    ap.add_argument("-p", "--prompt-tokens", type=int, default=128)
    ap.add_argument("-g", "--generation-tokens", type=int, default=32)
    ap.add_argument("-n", "--num-trials", type=int, default=2)
    a = ap.parse_args()
    p, g, n = a.prompt_tokens, a.generation_tokens, a.num_trials
    rows = []
    for name, fn in (
        ("lmx L3", lambda ad: run_lmx(a.lmx, a.model, ad, p, g, n, False)),
        ("lmx L1", lambda ad: run_lmx(a.lmx, a.model, ad, p, g, n, True)),
        ("mlx-lm", lambda ad: run_mlx_lm(a.model, ad, p, g, n)),
    ):
        base = fn(None)
        lora = fn(a.adapter)
        rows.append((name, base, lora))
    print(f"model: {a.model}; adapter: {a.adapter}; prompt {p}, generation {g}, {n} trials\n")
    print("| runtime | prompt tok/s base | with adapter | ratio | decode tok/s base | "
          "with adapter | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, (bp, bg), (lp, lg) in rows:
        print(f"| {name} | {bp:.2f} | {lp:.2f} | {lp / bp:.2f} | {bg:.2f} | {lg:.2f} | "
              f"{lg / bg:.2f} |")


if __name__ == "__main__":
    main()
