#!/usr/bin/env python3
"""Continuous batching side by side (docs/benchmarks.md, docs/batching.md).

For each concurrency level N: N streams, each a distinct random prompt of -p tokens and -g
generated tokens ignoring EOS, all submitted at once; reports the wall time from the first
submission to the last token, the aggregate output tokens/s (N * g / wall) and, where the runtime
exposes it, TTFT. Runtimes, one after another on the same machine:

- lmx: `lmx bench --concurrency N1,N2,... --json` (the library's scheduler, max_batch = N);
- mlx-lm: `BatchGenerator` (what `batch_generate` and mlx_lm.server batch with), completion and
  prefill batch sizes N, no stop tokens;
- llama.cpp: `llama-server --parallel N -t T` on the GGUF the MLX model was converted from, N
  concurrent /completion requests (token-id prompts, n_predict g, ignore_eos), one server per N.

usage: batch_cpu.py --model DIR [--gguf FILE --llama-server PATH] [--lmx build/lmx]
                    [--levels 1,4,16] [-p 128] [-g 64] [-t 2] [--skip mlx-lm,...]
Prints a Markdown table and, with --jsonl FILE, one JSON line per measurement.
"""
import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time


def lmx_rows(binary, model, levels, p, g):
    out = subprocess.run([binary, "bench", "--model", model, "--concurrency",
                          ",".join(map(str, levels)), "--prompt-tokens", str(p), "--gen-tokens",
                          str(g), "--json"], check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.strip().splitlines():
        j = json.loads(line)
        rows.append(dict(runtime="lmx", n=j["concurrency"], seconds=j["seconds"],
                         aggregate=j["aggregate_tps"], per_stream=j["per_stream_tps"],
                         ttft_p50=j["ttft_p50_s"], ttft_p99=j["ttft_p99_s"], note=j["tier"]))
    return rows


def mlx_lm_rows(model_dir, levels, p, g):
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator

    model, tok = load(model_dir)
    vocab = model.args.vocab_size
    rows = []
    for n in [1] + list(levels):  # the first: a warm-up
        mx.random.seed(n)
        prompts = mx.random.randint(0, vocab, (n, p)).tolist()
        gen = BatchGenerator(model, max_tokens=g, stop_tokens=None, completion_batch_size=n,
                             prefill_batch_size=n)
        t0 = time.perf_counter()
        gen.insert(prompts, [g] * n)
        first = {}
        count = 0
        while responses := gen.next_generated():
            for r in responses:
                first.setdefault(r.uid, time.perf_counter() - t0)
                count += 1
        wall = time.perf_counter() - t0
        gen.close()
        ttft = sorted(first.values())
        rows.append(dict(runtime="mlx-lm", n=n, seconds=wall, aggregate=count / wall,
                         per_stream=None, ttft_p50=ttft[len(ttft) // 2], ttft_p99=ttft[-1],
                         note=f"BatchGenerator, {count} tokens"))
    return rows[1:]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_rows(server, gguf, levels, p, g, threads, vocab):
    import random

    rows = []
    for n in levels:
        port = free_port()
        proc = subprocess.Popen([server, "-m", gguf, "--port", str(port), "--host", "127.0.0.1",
                                 "-t", str(threads), "--parallel", str(n), "-c",
                                 str(n * (p + g + 16)), "--no-webui"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                try:
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                    c.request("GET", "/health")
                    if c.getresponse().status == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.2)
            rng = random.Random(n)

            def one(prompt, out, i):
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
                body = dict(prompt=prompt, n_predict=g, ignore_eos=True, temperature=0,
                            cache_prompt=False)
                c.request("POST", "/completion", json.dumps(body),
                          {"Content-Type": "application/json"})
                r = json.loads(c.getresponse().read())
                out[i] = (time.perf_counter(), r.get("tokens_predicted", 0),
                          r.get("timings", {}).get("prompt_ms", 0) / 1000)

            for trial in range(2):  # the first: a warm-up
                prompts = [[rng.randrange(vocab) for _ in range(p)] for _ in range(n)]
                out = [None] * n
                t0 = time.perf_counter()
                ts = [threading.Thread(target=one, args=(prompts[i], out, i)) for i in range(n)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
            wall = max(o[0] for o in out) - t0
            count = sum(o[1] for o in out)
            rows.append(dict(runtime="llama.cpp", n=n, seconds=wall, aggregate=count / wall,
                             per_stream=None, ttft_p50=None, ttft_p99=None,
                             note=f"llama-server --parallel {n} -t {threads}"))
        finally:
            proc.terminate()
            proc.wait()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--gguf")
    ap.add_argument("--llama-server")
    ap.add_argument("--lmx", default="build/lmx")
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-g", type=int, default=64)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--skip", default="")
    ap.add_argument("--jsonl")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    skip = set(a.skip.split(","))
    rows = []
    load = lambda: os.getloadavg()[0]
    if "lmx" not in skip:
        l0 = load()
        rows += [dict(r, load=l0) for r in lmx_rows(a.lmx, a.model, levels, a.p, a.g)]
    if "mlx-lm" not in skip:
        l0 = load()
        rows += [dict(r, load=l0) for r in mlx_lm_rows(a.model, levels, a.p, a.g)]
    if "llama.cpp" not in skip and a.llama_server and a.gguf:
        vocab = json.load(open(os.path.join(a.model, "config.json")))["vocab_size"]
        l0 = load()
        rows += [dict(r, load=l0)
                 for r in llama_rows(a.llama_server, a.gguf, levels, a.p, a.g, a.t, vocab)]
    single = {r["runtime"]: r["aggregate"] for r in rows if r["n"] == 1}
    llama = {r["n"]: r["aggregate"] for r in rows if r["runtime"] == "llama.cpp"}
    print(f"prompt {a.p} tokens, {a.g} generated per stream; load average before each runtime\n")
    print("| runtime | streams | wall s | aggregate tok/s | x own 1 stream | x llama.cpp | "
          "per-stream tok/s | TTFT p50 / p99 s | load | note |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    fmt = lambda v, f="{:.1f}": "-" if v is None else f.format(v)
    for r in rows:
        own = r["aggregate"] / single[r["runtime"]] if r["runtime"] in single else None
        vs = r["aggregate"] / llama[r["n"]] if r["n"] in llama else None
        ttft = ("-" if r["ttft_p50"] is None else
                f"{r['ttft_p50']:.2f} / {r['ttft_p99']:.2f}")
        print(f"| {r['runtime']} | {r['n']} | {r['seconds']:.2f} | {r['aggregate']:.1f} | "
              f"{fmt(own, '{:.2f}')} | {fmt(vs, '{:.2f}')} | {fmt(r['per_stream'])} | {ttft} | "
              f"{r['load']:.2f} | {r['note']} |")
    if a.jsonl:
        with open(a.jsonl, "a") as f:
            for r in rows:
                f.write(json.dumps(dict(r, p=a.p, g=a.g)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
