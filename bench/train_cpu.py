#!/usr/bin/env python3
"""LoRA training speed and memory: `lmx lora --train` vs `mlx_lm.lora --train` in one run, same
model, data, flags and seed (docs/training.md, docs/benchmarks.md), each with and without
--grad-checkpoint.

Data: --rows text rows of random words (fixed seed) written to a temporary directory, so every
batch is full; the same files for both. Each configuration runs as its own process, one after
another. From each run: tokens/s and it/s (the mean of the progress reports after the first,
which holds the warm-up; all reports when there is only one), the MLX peak memory it reports
(mx.get_peak_memory, "Peak mem") and the process's peak RSS (wait4's ru_maxrss), and the final
train loss (the two runtimes compute the same losses: tests/models/test_train.cpp).
Before the measured runs each configuration trains 2 steps unmeasured (--no-warmup: not): a
compiled step's first run on the CPU has MLX build its fused kernels with the system C++ compiler
(cached under $TMPDIR/mlx), whose processes would otherwise count in the peak RSS and time.
--uncompiled adds lmx with MLX_DISABLE_COMPILE=1 (its training step not compiled) after each lmx
run, and --mlx-lm-uncompiled mlx_lm.lora likewise.

usage: train_cpu.py [--model build/testdata/smollm2-135m-instruct-4bit] [--lmx build/lmx]
                    [--iters 40] [--batch-size 4] [--num-layers 16] [--seq-words 120]
                    [--rows 64] [--steps-per-report 10] [--skip mlx-lm,checkpoint]
                    [--uncompiled] [--mlx-lm-uncompiled] [--jsonl FILE]
Prints a Markdown table. Needs a quiet machine for numbers worth keeping; --iters 2
--steps-per-report 1 checks that it runs.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = ("the of and to in is was for on that with as by at from this have are be or an model "
         "token language text hello world quick brown fox jumps over lazy dog code return print "
         "data train loss memory speed batch layer weight gradient").split()

# mlx_lm.lora's main() and run() (whose progress display is not machine-readable and whose run()
# replaces the training callback) with a callback writing each report as a JSON line, as lmx's
# --metrics-file does. argv: METRICS_FILE then mlx_lm.lora's flags.
MLX_LM = """
import json, sys, types
import numpy as np
from mlx_lm import lora
from mlx_lm.tuner.callbacks import TrainingCallback
from mlx_lm.tuner.datasets import load_dataset
from mlx_lm.utils import load

out = open(sys.argv[1], "w")

class Metrics(TrainingCallback):
    def on_train_loss_report(self, info):
        out.write(json.dumps({k: float(v) for k, v in info.items()}) + "\\n")
        out.flush()

args = vars(lora.build_parser().parse_args(sys.argv[2:]))
for k, v in lora.CONFIG_DEFAULTS.items():
    if args.get(k) is None:
        args[k] = v
args = types.SimpleNamespace(**args)
np.random.seed(args.seed)
model, tokenizer = load(args.model)
train_set, valid_set, _ = load_dataset(args, tokenizer)
lora.train_model(args, model, train_set, valid_set, Metrics())
"""


def write_data(dir_, rows, words, seed=0):
    rng = random.Random(seed)
    dir_.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", rows), ("valid", 8)):
        with open(dir_ / f"{split}.jsonl", "w") as f:
            for _ in range(n):
                text = " ".join(rng.choice(WORDS) for _ in range(words))
                f.write(json.dumps({"text": text}) + "\n")


def parse(metrics_file):
    reports = [dict(loss=j["train_loss"], it_sec=j["iterations_per_second"],
                    tok_sec=j["tokens_per_second"], peak=j["peak_memory"])
               for j in map(json.loads, open(metrics_file)) if "train_loss" in j]
    if not reports:
        sys.exit(f"no train report in {metrics_file}")
    timed = reports[1:] or reports
    return dict(tok_sec=sum(r["tok_sec"] for r in timed) / len(timed),
                it_sec=sum(r["it_sec"] for r in timed) / len(timed),
                peak_gb=max(r["peak"] for r in reports), final_loss=reports[-1]["loss"])


def measured(cmd, env=None):
    """Runs cmd in a child of a fresh Python process, so ru_maxrss is this run's alone."""
    probe = ("import resource, subprocess, sys, json\n"
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "sys.stderr.write(p.stderr[-3000:])\n"
             "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
             "sys.stderr.write('\\nMAXRSS_KB %d\\n' % rss)\n"
             "sys.exit(p.returncode)\n")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True,
                       env=None if env is None else dict(os.environ, **env))
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    rss_kb = int(re.search(r"MAXRSS_KB (\d+)", p.stderr)[1])
    return seconds, rss_kb / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="build/testdata/smollm2-135m-instruct-4bit")
    ap.add_argument("--lmx", default="build/lmx")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--num-layers", type=int, default=16)
    ap.add_argument("--seq-words", type=int, default=120)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--steps-per-report", type=int, default=10)
    ap.add_argument("--learning-rate", type=float, default=1e-5)
    ap.add_argument("--skip", default="", help="comma list of: mlx-lm, checkpoint")
    ap.add_argument("--no-warmup", action="store_true",
                    help="no unmeasured 2-step run of each configuration first")
    ap.add_argument("--uncompiled", action="store_true",
                    help="also lmx with MLX_DISABLE_COMPILE=1")
    ap.add_argument("--mlx-lm-uncompiled", action="store_true",
                    help="also mlx_lm.lora with MLX_DISABLE_COMPILE=1")
    ap.add_argument("--jsonl", type=Path)
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_data(tmp / "data", a.rows, a.seq_words)
        common = ["--model", a.model, "--train", "--data", str(tmp / "data"), "--iters",
                  str(a.iters), "--batch-size", str(a.batch_size), "--num-layers",
                  str(a.num_layers), "--steps-per-report", str(a.steps_per_report),
                  # one validation batch at step 1 and the end: it is not timed by either
                  "--steps-per-eval", str(10 ** 6), "--val-batches", "1", "--learning-rate",
                  str(a.learning_rate), "--save-every", str(10 ** 6), "--seed", "0"]
        off = {"MLX_DISABLE_COMPILE": "1"}
        lmx = lambda m: [a.lmx, "lora", "--metrics-file", m]
        mlx_lm = lambda m: [sys.executable, "-c", MLX_LM, m]
        runs = [("lmx", lmx, None)]
        if a.uncompiled:
            runs.append(("lmx-uncompiled", lmx, off))
        if "mlx-lm" not in skip:
            runs.append(("mlx-lm", mlx_lm, None))
            if a.mlx_lm_uncompiled:
                runs.append(("mlx-lm-uncompiled", mlx_lm, off))
        rows = []
        configs = [(c, r) for c in ([False] if "checkpoint" in skip else [False, True])
                   for r in runs]
        if not a.no_warmup:
            warm = list(common)
            warm[warm.index("--iters") + 1] = "2"
            for checkpoint, (name, prefix, env) in configs:
                cmd = prefix(str(tmp / "warmup.jsonl")) + warm + [
                    "--adapter-path", str(tmp / "adapters_warmup")]
                measured(cmd + (["--grad-checkpoint"] if checkpoint else []), env)
        for checkpoint in ([False] if "checkpoint" in skip else [False, True]):
            for name, prefix, env in runs:
                adapters = tmp / f"adapters_{name}_{int(checkpoint)}"
                metrics = tmp / f"metrics_{name}_{int(checkpoint)}.jsonl"
                cmd = prefix(str(metrics)) + common + ["--adapter-path", str(adapters)]
                if checkpoint:
                    cmd.append("--grad-checkpoint")
                load = os.getloadavg()[0]
                seconds, rss = measured(cmd, env)
                row = dict(runtime=name, grad_checkpoint=checkpoint, wall_s=round(seconds, 2),
                           load_1m_before=round(load, 2), load_1m_after=round(os.getloadavg()[0], 2),
                           peak_rss_gb=round(rss, 3), **parse(metrics))
                rows.append(row)
                if a.jsonl:
                    with open(a.jsonl, "a") as f:
                        f.write(json.dumps(dict(row, model=a.model, iters=a.iters,
                                                seq_words=a.seq_words,
                                                steps_per_report=a.steps_per_report,
                                                batch_size=a.batch_size,
                                                num_layers=a.num_layers)) + "\n")

    print(f"model {a.model}, {a.iters} iters, batch {a.batch_size}, {a.num_layers} layers, "
          f"~{a.seq_words} words a row")
    print("| runtime | grad ckpt | tokens/s | it/s | MLX peak GB | peak RSS GB | final loss | wall s "
          "| load 1m |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['runtime']} | {'yes' if r['grad_checkpoint'] else 'no'} | "
              f"{r['tok_sec']:.1f} | {r['it_sec']:.3f} | {r['peak_gb']:.3f} | "
              f"{r['peak_rss_gb']:.3f} | {r['final_loss']:.3f} | {r['wall_s']:.1f} | "
              f"{r['load_1m_before']:.2f}-{r['load_1m_after']:.2f} |")
    by = {(r["runtime"], r["grad_checkpoint"]): r for r in rows}
    for ck in (False, True):
        for ours in ("lmx", "lmx-uncompiled"):
            if (ours, ck) in by and ("mlx-lm", ck) in by:
                l, m = by[(ours, ck)], by[("mlx-lm", ck)]
                print(f"grad checkpoint {'on' if ck else 'off'}: {ours} / mlx-lm tokens/s "
                      f"{l['tok_sec'] / m['tok_sec']:.2f}x, MLX peak memory "
                      f"{l['peak_gb'] / m['peak_gb']:.2f}x, peak RSS "
                      f"{l['peak_rss_gb'] / m['peak_rss_gb']:.2f}x")
    for name, _, _ in runs:
        if (name, False) in by and (name, True) in by:
            off, on = by[(name, False)], by[(name, True)]
            print(f"{name}: --grad-checkpoint peak memory {off['peak_gb']:.3f} -> "
                  f"{on['peak_gb']:.3f} GB ({1 - on['peak_gb'] / off['peak_gb']:.0%} less)")


if __name__ == "__main__":
    main()
