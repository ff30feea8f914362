#!/usr/bin/env python3
"""The CPU tiers against mlx-lm and llama.cpp in one run (docs/benchmarks.md).

Runs, one after another on the same machine: `lmx bench` (default tier L3), `lmx bench --exact`
(tier L1), `python -m mlx_lm.benchmark` (mlx-lm on the CPU wheel) on the MLX model, and
llama.cpp's `llama-bench` with --threads on the GGUF the MLX model was converted from. Reports
prompt (prefill) tok/s, decode tok/s, each process's peak RSS (wait4), the load average before
each run, and ratios against llama.cpp (--threads) as a Markdown table; lmx with one pool thread,
lmx with its int8-activation path off (LMX_CPU_INT8=0) and llama.cpp with one thread are extra
rows (on a shared machine, spinning threads lose). --repeat R runs the whole sequence R times and
reports each row's median (and the range of the load averages before its runs); --slow-repeat S
runs the two stock-MLX rows (lmx --exact, mlx-lm: ~10 tok/s, not in the head-to-head) in the
first S sequences only. Every runtime
decodes after a prompt of -p tokens (llama-bench -d), and prefills from an empty context. That
llama-bench run holds a context of 2p + g tokens where `lmx bench` holds p + g, so the row
"llama.cpp, one context" (`llama-bench -pg P,G`) gives llama.cpp's peak RSS like for like.

usage: compare_cpu.py --model DIR [--gguf FILE --llama-bench PATH] [--lmx build/lmx]
                      [-p 512] [-g 128] [-n 3] [-t 2] [--repeat 1] [--slow-repeat R]
"""
import argparse
import json
import math
import os
import platform
import re
import statistics
import sys
from pathlib import Path


def run_rss(cmd, env=None):
    """stdout and the peak RSS (MB) of one child process, from wait4."""
    pid = os.fork()
    if pid == 0:
        if env:
            os.environ.update(env)
        fd = os.open(os.devnull, os.O_WRONLY)
        out = os.open(f"/tmp/compare_cpu_{os.getpid()}.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, 1)
        os.dup2(fd, 2)
        os.execvp(cmd[0], cmd)
    _, status, ru = os.wait4(pid, 0)
    path = f"/tmp/compare_cpu_{pid}.out"
    text = Path(path).read_text()
    os.unlink(path)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{text}")
    return text, ru.ru_maxrss / 1024  # KiB on Linux


def lmx(binary, model, p, g, n, extra, env=None):
    out, rss = run_rss([binary, "bench", "--model", model, "--prompt-tokens", str(p),
                        "--gen-tokens", str(g), "--trials", str(n), "--json", *extra], env)
    j = json.loads(out.strip().splitlines()[-1])
    return dict(prompt=j["prompt_tps"], decode=j["generation_tps"], rss=rss, note=j["tier"])


def mlx_lm(model, p, g, n):
    out, rss = run_rss([sys.executable, "-m", "mlx_lm.benchmark", "--model", model, "-p", str(p),
                        "-g", str(g), "-n", str(n)])
    line = [l for l in out.splitlines() if l.startswith("Averages:")][-1]
    v = dict(re.findall(r"(\w+)=([\d.]+)", line))
    return dict(prompt=float(v["prompt_tps"]), decode=float(v["generation_tps"]), rss=rss,
                note="mlx-lm CPU")


def llama_cpp(bench, gguf, p, g, n, threads):
    # lmx and mlx-lm decode after their p-token prompt, so llama.cpp's decode runs at depth p too
    # (-d); its prefill stays at depth 0 like theirs.
    out, rss = run_rss([bench, "-m", gguf, "-p", str(p), "-n", str(g), "-d", f"0,{p}", "-r",
                        str(n), "-t", str(threads), "-o", "json"])
    rows = json.loads(out[out.index("["):])
    pp = [r for r in rows if r["n_prompt"] == p and r["n_gen"] == 0 and r["n_depth"] == 0][0]
    tg = [r for r in rows if r["n_gen"] == g and r["n_prompt"] == 0 and r["n_depth"] == p][0]
    return dict(prompt=pp["avg_ts"], decode=tg["avg_ts"], rss=rss,
                note=f"llama.cpp {pp.get('build_commit', '')}, {threads} threads")


def llama_cpp_one_context(bench, gguf, p, g, threads):
    # The peak RSS like for like: one context of p + g tokens, as `lmx bench` holds (the run above
    # also prefills at depth p, a context of 2p + g). Its speeds are not comparable (pp and tg in
    # one figure), so only the RSS is reported.
    _, rss = run_rss([bench, "-m", gguf, "-p", "0", "-n", "0", "-pg", f"{p},{g}", "-r", "1", "-t",
                      str(threads), "-o", "json"])
    return dict(prompt=math.nan, decode=math.nan, rss=rss,
                note=f"llama.cpp -pg {p},{g}: peak RSS of one context only")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="MLX model directory")
    ap.add_argument("--gguf", help="the GGUF the MLX model was converted from")
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench binary (left out: no llama.cpp "
                    "row, ratios against mlx-lm)")
    ap.add_argument("--lmx", default=str(Path(__file__).resolve().parents[1] / "build" / "lmx"))
    ap.add_argument("-p", "--prompt-tokens", type=int, default=512)
    ap.add_argument("-g", "--generation-tokens", type=int, default=128)
    ap.add_argument("-n", "--num-trials", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="sequences to run; rows give medians")
    ap.add_argument("--slow-repeat", type=int, help="sequences that run the stock-MLX rows "
                    "(default: all)")
    a = ap.parse_args()

    configs = [
        ("lmx default", lambda: lmx(a.lmx, a.model, a.prompt_tokens, a.generation_tokens,
                                    a.num_trials, [])),
        ("lmx default, LMX_CPU_THREADS=1",
         lambda: lmx(a.lmx, a.model, a.prompt_tokens, a.generation_tokens, a.num_trials, [],
                     {"LMX_CPU_THREADS": "1"})),
        ("lmx LMX_CPU_INT8=0",
         lambda: lmx(a.lmx, a.model, a.prompt_tokens, a.generation_tokens, a.num_trials, [],
                     {"LMX_CPU_INT8": "0"})),
        ("lmx LMX_CPU_INT8=0, LMX_CPU_THREADS=1",
         lambda: lmx(a.lmx, a.model, a.prompt_tokens, a.generation_tokens, a.num_trials, [],
                     {"LMX_CPU_INT8": "0", "LMX_CPU_THREADS": "1"})),
        ("lmx --exact", lambda: lmx(a.lmx, a.model, a.prompt_tokens, a.generation_tokens,
                                    a.num_trials, ["--exact"])),
        ("mlx-lm", lambda: mlx_lm(a.model, a.prompt_tokens, a.generation_tokens, a.num_trials)),
        ("llama.cpp, 1 thread", lambda: llama_cpp(a.llama_bench, a.gguf, a.prompt_tokens,
                                                  a.generation_tokens, a.num_trials, 1)),
        ("llama.cpp, one context", lambda: llama_cpp_one_context(
            a.llama_bench, a.gguf, a.prompt_tokens, a.generation_tokens, a.threads)),
        ("llama.cpp", lambda: llama_cpp(a.llama_bench, a.gguf, a.prompt_tokens,
                                        a.generation_tokens, a.num_trials, a.threads)),
    ]
    slow = {"lmx --exact", "mlx-lm"}
    samples = {}
    for rep in range(a.repeat):
        for name, fn in configs:
            if name.startswith("llama.cpp") and not (a.llama_bench and a.gguf):
                continue
            if name in slow and a.slow_repeat is not None and rep >= a.slow_repeat:
                continue
            load = os.getloadavg()[0]
            r = fn()
            r.update(name=name, load=load)
            samples.setdefault(name, []).append(r)
            print(f"[{rep + 1}/{a.repeat}] {name}: {r}", file=sys.stderr)
    runs = []
    for name, rs in samples.items():
        loads = [r["load"] for r in rs]
        runs.append(dict(name=name, note=rs[0]["note"],
                         prompt=statistics.median(r["prompt"] for r in rs),
                         decode=statistics.median(r["decode"] for r in rs),
                         rss=statistics.median(r["rss"] for r in rs),
                         load=f"{min(loads):.2f}" if len(rs) == 1 else
                         f"{min(loads):.2f} - {max(loads):.2f}"))

    cpu = platform.machine()
    try:
        cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
               if l.startswith("model name")][0]
    except (OSError, IndexError):
        pass
    ref = runs[-1]
    vs = ref["name"]
    print(f"machine: {cpu}, {os.cpu_count()} cores; prompt {a.prompt_tokens} tokens, decode "
          f"{a.generation_tokens} tokens, {a.num_trials} trials (lmx and mlx-lm after a warm-up); "
          f"median of {a.repeat} sequence(s)" +
          (f", the stock-MLX rows of {min(a.slow_repeat, a.repeat)}" if a.slow_repeat is not None
           else "") + "\n")
    # On a loaded 2-core machine llama.cpp's 1-thread row is its better one: ratios to it too.
    one = next((r for r in runs if r["name"] == "llama.cpp, 1 thread"), None)
    extra = " decode / llama.cpp 1 thread |" if one else ""
    print("| runtime | path | prefill tok/s | decode tok/s | peak RSS MB | load avg before | "
          f"prefill / {vs} | decode / {vs} |{extra}")
    print("|---|---|---|---|---|---|---|---|" + ("---|" if one else ""))
    def num(v, digits):
        return "-" if math.isnan(v) else f"{v:.{digits}f}"

    for r in runs:
        print(f"| {r['name']} | {r['note']} | {num(r['prompt'], 1)} | {num(r['decode'], 1)} | "
              f"{r['rss']:.0f} | {r['load']} | {num(r['prompt'] / ref['prompt'], 2)} | "
              f"{num(r['decode'] / ref['decode'], 2)} |" +
              (f" {num(r['decode'] / one['decode'], 2)} |" if one else ""))


if __name__ == "__main__":
    main()
