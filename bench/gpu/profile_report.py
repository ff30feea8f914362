#!/usr/bin/env python3
"""Kernel breakdown from bench/gpu/profile.sh's Nsight Compute CSVs: kernels and GPU time per
decode token (difference of the 8- and 4-token runs over their 8 extra decode steps), per
2048-token prefill (half of the run: warm-up and one trial), grouped by kernel family, and the
host share of a decode step (wall time per token from timing.jsonl minus GPU time per token).

usage: profile_report.py PROFILE_DIR
"""
import csv
import json
import re
import sys
from collections import Counter
from pathlib import Path


def kernels(path):
    rows = list(csv.DictReader(l for l in path.read_text().splitlines() if l.startswith('"')))
    out = []
    for r in rows:
        name = r.get("Kernel Name") or r.get("Function Name") or ""
        dur = r.get("gpu__time_duration.sum", "")
        try:
            ns = float(dur.replace(",", ""))
        except ValueError:
            continue  # the units row
        out.append((name, ns))
    return out


def family(name):
    base = re.sub(r"<.*", "", name).strip()
    base = re.sub(r"\(.*", "", base)
    return base[:60]


def summary(ks, divisor):
    c, t = Counter(), Counter()
    for n, ns in ks:
        c[family(n)] += 1
        t[family(n)] += ns
    return {f: (c[f] / divisor, t[f] / divisor / 1e3) for f in c}


def main():
    d = Path(sys.argv[1])
    timing = [json.loads(l) for l in (d / "timing.jsonl").read_text().splitlines() if l.strip()]
    k8, k4 = kernels(d / "decode8.csv"), kernels(d / "decode4.csv")
    kp = kernels(d / "prefill2048.csv")
    print(f"profile: decode8 {len(k8)} kernels, decode4 {len(k4)}, prefill2048 {len(kp)}")
    s8, s4 = summary(k8, 1), summary(k4, 1)
    steps = 8  # (8 - 4) extra tokens in the warm-up and in the trial
    per_tok = {f: ((s8[f][0] - s4.get(f, (0, 0))[0]) / steps,
                   (s8[f][1] - s4.get(f, (0, 0))[1]) / steps) for f in s8}
    n_tok = sum(v[0] for v in per_tok.values())
    us_tok = sum(v[1] for v in per_tok.values())
    wall = 1e6 / timing[0]["generation_tps"]
    print(f"\nDecode: {n_tok:.0f} kernels per token, GPU time {us_tok:.0f} us per token; wall "
          f"{wall:.0f} us per token at {timing[0]['generation_tps']:.1f} tok/s -> GPU busy "
          f"{100 * us_tok / wall:.0f}%, host/launch gap {wall - us_tok:.0f} us per token\n")
    print("| kernel family (decode) | per token | us per token |\n|---|---|---|")
    for f, (n, us) in sorted(per_tok.items(), key=lambda x: -x[1][1])[:20]:
        if n > 0.01:
            print(f"| `{f}` | {n:.1f} | {us:.1f} |")
    sp = summary(kp, 2)
    n_p = sum(v[0] for v in sp.values())
    us_p = sum(v[1] for v in sp.values())
    pp = [t for t in timing if t["prompt_tokens"] == 2048][0]["prompt_tps"]
    print(f"\nPrefill 2048: {n_p:.0f} kernels, GPU time {us_p / 1e3:.1f} ms; wall "
          f"{2048 / pp * 1e3:.1f} ms at {pp:.0f} tok/s\n")
    print("| kernel family (prefill 2048) | count | ms |\n|---|---|---|")
    for f, (n, us) in sorted(sp.items(), key=lambda x: -x[1][1])[:15]:
        print(f"| `{f}` | {n:.0f} | {us / 1e3:.2f} |")
    names = sorted({n for n, _ in k8 + kp if re.search(r"q(mv|mm)|quant|gather", n, re.I)})
    print("\nQuantized-matmul kernels seen:")
    for n in names[:20]:
        print(f"- `{n[:160]}`")


if __name__ == "__main__":
    main()
