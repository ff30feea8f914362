#!/usr/bin/env python3
"""Kernel breakdown from bench/gpu/profile.sh's CUPTI traces (bench/gpu/ktrace.cpp CSVs), for lmx
and mlx-lm side by side:

- decode: the difference of the 40- and 8-token traces over their 64 extra decode steps (32 in
  the warm-up, 32 in the trial): kernels per token, GPU time per token (the sum of kernel
  durations, and the union of their intervals), per kernel family;
- host share of a decode step: the wall time per token of the untraced runs (timing*.jsonl)
  minus the GPU busy time per token;
- prefill 2048: half of its trace (warm-up and one trial), per family;
- the quantized-matmul kernels each runtime launched.

usage: profile_report.py PROFILE_DIR
"""
import csv
import json
import re
import sys
from collections import Counter
from pathlib import Path

STEPS = 64  # (40 - 8) generated tokens, in the warm-up and in the trial


def load(path):
    if not path.exists():
        return None
    with path.open() as f:
        return [
            (r["name"], int(r["start_ns"]), int(r["end_ns"]), r["kind"], r["grid"])
            for r in csv.DictReader(f)
        ]


def family(name):
    base = re.sub(r"^void ", "", name)
    base = re.sub(r"<.*", "", base)
    base = re.sub(r"\(.*", "", base).strip()
    return base[:70]


def busy_ns(recs):
    """Union of the records' [start, end) intervals."""
    total, cur_s, cur_e = 0, None, None
    for _, s, e, _, _ in sorted(recs, key=lambda r: r[1]):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def by_family(recs):
    c, t = Counter(), Counter()
    for n, s, e, _, _ in recs:
        c[family(n)] += 1
        t[family(n)] += e - s
    return c, t


def timing(path, prompt, gen):
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if r["prompt_tokens"] == prompt and r["gen_tokens"] == gen:
                return r
    return None


def report(d, rt, timing_file):
    short, long_, pre = (load(d / f"{rt}-{k}.csv") for k in ("decode8", "decode40", "prefill2048"))
    if not short or not long_:
        print(f"\n## {rt}: no decode traces\n")
        return
    t_dec = timing(d / timing_file, 16, 64)
    t_pre = timing(d / timing_file, 2048, 1)
    cs, ts = by_family(short)
    cl, tl = by_family(long_)
    fams = set(cl) | set(cs)
    per = {f: ((cl[f] - cs[f]) / STEPS, (tl[f] - ts[f]) / STEPS / 1e3) for f in fams}
    n_tok = (len(long_) - len(short)) / STEPS
    sum_us = (sum(e - s for _, s, e, _, _ in long_) - sum(e - s for _, s, e, _, _ in short)) / STEPS / 1e3
    busy_us = (busy_ns(long_) - busy_ns(short)) / STEPS / 1e3
    print(f"\n## {rt}\n")
    line = (f"Decode (16-token prompt): {n_tok:.1f} kernels per token; GPU time per token "
            f"{sum_us:.0f} us (kernel durations summed), {busy_us:.0f} us busy (their union)")
    if t_dec:
        wall = 1e6 / t_dec["generation_tps"]
        line += (f"; wall {wall:.0f} us per token at {t_dec['generation_tps']:.1f} tok/s untraced "
                 f"-> GPU busy {100 * busy_us / wall:.0f}% of the step, host/launch gaps "
                 f"{wall - busy_us:.0f} us per token ({(wall - busy_us) / max(n_tok, 1):.1f} us "
                 "per kernel)")
    print(line + ".\n")
    print("| kernel family (decode) | per token | us per token |\n|---|---|---|")
    for f, (n, us) in sorted(per.items(), key=lambda x: -x[1][1])[:18]:
        if n > 0.01:
            print(f"| `{f}` | {n:.1f} | {us:.1f} |")
    if pre:
        cp, tp = by_family(pre)
        n_p = len(pre) / 2
        us_p = sum(e - s for _, s, e, _, _ in pre) / 2 / 1e3
        line = (f"\nPrefill 2048 (half of warm-up + trial, including the first decode step's "
                f"sampling): {n_p:.0f} kernels, GPU time {us_p / 1e3:.1f} ms summed, "
                f"{busy_ns(pre) / 2 / 1e6:.1f} ms busy")
        if t_pre:
            line += (f"; wall {2048 / t_pre['prompt_tps'] * 1e3:.1f} ms at "
                     f"{t_pre['prompt_tps']:.0f} tok/s untraced")
        print(line + ".\n")
        print("| kernel family (prefill 2048) | count | ms |\n|---|---|---|")
        for f in sorted(cp, key=lambda f: -tp[f])[:14]:
            print(f"| `{f}` | {cp[f] / 2:.0f} | {tp[f] / 2 / 1e6:.2f} |")
    names = Counter()
    for n, *_ in long_ + (pre or []):
        if re.search(r"q(mv|mm)|quant|affine|gemv|gemm|cutlass|sm90", n, re.I):
            names[n[:200]] += 1
    print(f"\n{rt}: matmul kernels launched (decode40 + prefill2048 traces):\n")
    for n, c in names.most_common(14):
        print(f"- {c} x `{n}`")


def main():
    d = Path(sys.argv[1])
    print(f"# Kernel profile ({d})")
    report(d, "lmx", "timing.jsonl")
    report(d, "mlx-lm", "timing-mlx-lm.jsonl")


if __name__ == "__main__":
    main()
