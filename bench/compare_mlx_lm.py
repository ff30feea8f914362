#!/usr/bin/env python3
"""lmx vs mlx-lm on the same model in one run: prompt and decode tokens/s, peak memory, ratios.

Runs `python -m mlx_lm.benchmark` and `lmx bench --json` with the same prompt length, generation
length and trial count (both time a random prompt after one warm-up run) and prints a Markdown
table for docs/benchmarks.md.

usage: compare_mlx_lm.py --model DIR [--lmx build/lmx] [-p 512] [-g 128] [-n 3] [--exact]
"""
import argparse
import json
import platform
import re
import subprocess
import sys
from pathlib import Path


def run_mlx_lm(model, p, g, n):
    out = subprocess.run(
        [sys.executable, "-m", "mlx_lm.benchmark", "--model", model, "-p", str(p), "-g", str(g),
         "-n", str(n)],
        check=True, capture_output=True, text=True).stdout
    line = [l for l in out.splitlines() if l.startswith("Averages:")][-1]
    vals = dict(re.findall(r"(\w+)=([\d.]+)", line))
    return {"prompt_tps": float(vals["prompt_tps"]), "generation_tps": float(vals["generation_tps"]),
            "peak_memory_gb": float(vals["peak_memory"])}


def run_lmx(lmx, model, p, g, n, extra):
    out = subprocess.run(
        [lmx, "bench", "--model", model, "--prompt-tokens", str(p), "--gen-tokens", str(g),
         "--trials", str(n), "--json", *extra],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--lmx", default=str(Path(__file__).resolve().parents[1] / "build" / "lmx"))
    ap.add_argument("-p", "--prompt-tokens", type=int, default=512)
    ap.add_argument("-g", "--generation-tokens", type=int, default=128)
    ap.add_argument("-n", "--num-trials", type=int, default=3)
    args = ap.parse_args()

    ref = run_mlx_lm(args.model, args.prompt_tokens, args.generation_tokens, args.num_trials)
    ours = run_lmx(args.lmx, args.model, args.prompt_tokens, args.generation_tokens,
                   args.num_trials, [])
    cpu = platform.processor() or platform.machine()
    try:
        cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if
               l.startswith("model name")][0]
    except (OSError, IndexError):
        pass
    print(f"model: {args.model}; prompt {args.prompt_tokens} tokens, generation "
          f"{args.generation_tokens} tokens, {args.num_trials} trials after a warm-up")
    print(f"machine: {cpu}; lmx backend: {ours['backend']}\n")
    print("| runtime | prompt tok/s | decode tok/s | peak memory GB |")
    print("|---|---|---|---|")
    print(f"| mlx-lm | {ref['prompt_tps']:.2f} | {ref['generation_tps']:.2f} | "
          f"{ref['peak_memory_gb']:.3f} |")
    print(f"| lmx (L1) | {ours['prompt_tps']:.2f} | {ours['generation_tps']:.2f} | "
          f"{ours['peak_memory_gb']:.3f} |")
    print(f"| ratio lmx / mlx-lm | {ours['prompt_tps'] / ref['prompt_tps']:.3f} | "
          f"{ours['generation_tps'] / ref['generation_tps']:.3f} | |")


if __name__ == "__main__":
    main()
