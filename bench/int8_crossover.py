#!/usr/bin/env python3
"""Where the CPU kernels' int8-activation path stops paying (docs/cpu.md, kInt8MaxRows).

Runs `lmx bench` with prompts of M tokens (one forward of M rows through every quantized matmul
of the model) with LMX_CPU_INT8=all and with LMX_CPU_INT8=0, alternating, and prints the median
prompt tok/s of each and their ratio per M as a Markdown table, with the load average range.

usage: int8_crossover.py --model DIR [--lmx build/lmx] [--rows 1,2,4,8,16,32,64] [-n 5]
                         [--repeat 3] [--threads N]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def prompt_tps(lmx, model, m, trials, env):
    out = subprocess.run([lmx, "bench", "--model", model, "--prompt-tokens", str(m),
                          "--gen-tokens", "1", "--trials", str(trials), "--json"],
                         env={**os.environ, **env}, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["prompt_tps"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--lmx", default=str(Path(__file__).resolve().parents[1] / "build" / "lmx"))
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("-n", "--trials", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", help="LMX_CPU_THREADS for every run")
    a = ap.parse_args()
    base = {"LMX_CPU_THREADS": a.threads} if a.threads else {}
    loads = []
    print("| M | int8 tok/s | float32 tok/s | int8 / float32 |")
    print("|---|---|---|---|")
    for m in [int(v) for v in a.rows.split(",")]:
        t = {"all": [], "0": []}
        for _ in range(a.repeat):
            for mode in t:
                loads.append(os.getloadavg()[0])
                t[mode].append(prompt_tps(a.lmx, a.model, m, a.trials,
                                          {**base, "LMX_CPU_INT8": mode}))
        i8, f32 = statistics.median(t["all"]), statistics.median(t["0"])
        print(f"| {m} | {i8:.1f} | {f32:.1f} | {i8 / f32:.2f} |", flush=True)
    print(f"\nload average before the runs: {min(loads):.2f} - {max(loads):.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
