#!/usr/bin/env python3
"""lmx serve overhead and prompt-cache benefit, in one run on one model.

1. Decode tokens/s over HTTP (a streaming /v1/completions of a random token prompt with
   ignore_eos, tokens counted from the first streamed token to the last, mlx-lm's convention)
   against `lmx bench --json` with the same prompt length, generation length and trials; trials
   of the two alternate so that load on a shared machine hits both alike.
   The same requests' decode speed as the server's engine counted it (its log line per job)
   gives the HTTP overhead without the machine's load between runs in it.
2. Time to first token of a second chat turn (history = first turn + its answer + a new
   question) with the prompt cache (default) and without it (--prompt-cache-size 0).

usage: serve_bench.py --model DIR [--lmx build/lmx] [-p 512] [-g 128] [-n 3] [--system-tokens 150]
Prints a Markdown table for docs/benchmarks.md.
"""
import argparse
import http.client
import json
import random
import socket
import re
import subprocess
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, lmx, model, *flags):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+")
        self.proc = subprocess.Popen([lmx, "serve", "--model", model, "--port", str(self.port),
                                      "--log-level", "INFO", *flags], stderr=self.log)
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("server did not start")

    def stream(self, path, body):
        """Returns (seconds to the first content chunk, timestamps of content chunks, usage)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
        t0 = time.perf_counter()
        c.request("POST", path, json.dumps({**body, "stream": True,
                                             "stream_options": {"include_usage": True}}),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        stamps, usage = [], None
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                usage = d["usage"]
            ch = d.get("choices") or [{}]
            piece = ch[0].get("text") or (ch[0].get("delta") or {}).get("content")
            if piece:
                stamps.append(time.perf_counter())
        c.close()
        return (stamps[0] - t0 if stamps else None), stamps, usage

    def last_job_tps(self):
        """The engine's own decode tokens/s of the last job, from the server's log."""
        with open(self.log.name) as f:
            lines = [l for l in f if "INFO: job:" in l]
        return float(re.search(r"generation \d+ tokens, ([\d.]+) tokens-per-sec", lines[-1])[1])

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


def lmx_bench(lmx, model, p, g):
    out = subprocess.run([lmx, "bench", "--model", model, "--prompt-tokens", str(p),
                          "--gen-tokens", str(g), "--trials", "1", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--lmx", default="build/lmx")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-g", type=int, default=128)
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--system-tokens", type=int, default=150)
    a = ap.parse_args()

    rng = random.Random(0)
    srv = Server(a.lmx, a.model, "--prompt-cache-size", "0")
    http_tps, bench_tps, engine_tps = [], [], []
    try:
        for trial in range(a.n + 1):  # the first round warms up both
            prompt = [rng.randrange(1000, 40000) for _ in range(a.p)]
            _, stamps, usage = srv.stream("/v1/completions", {"prompt": prompt, "max_tokens": a.g,
                                                              "ignore_eos": True,
                                                              "temperature": 0})
            b = lmx_bench(a.lmx, a.model, a.p, a.g)
            if trial == 0:
                continue
            # mlx-lm's convention (lmx bench too): tokens over the time since the first token.
            http_tps.append(usage["completion_tokens"] / (stamps[-1] - stamps[0]))
            engine_tps.append(srv.last_job_tps())
            bench_tps.append(b["generation_tps"])
    finally:
        srv.stop()

    words = "the quick brown fox jumps over the lazy dog and keeps running far away".split()
    system = " ".join(rng.choice(words) for _ in range(a.system_tokens))
    turn1 = [{"role": "system", "content": system}, {"role": "user", "content": "Summarize."}]
    ttft = {}
    for label, flags in (("with prompt cache", []), ("without prompt cache",
                                                      ["--prompt-cache-size", "0"])):
        srv = Server(a.lmx, a.model, *flags)
        try:
            times, cached = [], []
            for _ in range(a.n):
                c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=3600)
                c.request("POST", "/v1/chat/completions", json.dumps(
                    {"messages": turn1, "max_tokens": 16, "temperature": 0}),
                    {"Content-Type": "application/json"})
                answer = json.loads(c.getresponse().read())["choices"][0]["message"]["content"]
                turn2 = turn1 + [{"role": "assistant", "content": answer},
                                 {"role": "user", "content": "And in one word?"}]
                t, _, usage = srv.stream("/v1/chat/completions",
                                         {"messages": turn2, "max_tokens": 4, "temperature": 0})
                times.append(t)
                cached.append((usage["prompt_tokens_details"]["cached_tokens"],
                               usage["prompt_tokens"]))
            ttft[label] = (sorted(times)[len(times) // 2], cached[-1])
        finally:
            srv.stop()

    med = lambda v: sorted(v)[len(v) // 2]
    print(f"| decode, {a.p}-token prompt, {a.g} tokens | tok/s (median of {a.n}) |")
    print("|---|---|")
    print(f"| lmx bench | {med(bench_tps):.2f} |")
    print(f"| lmx serve, HTTP streaming | {med(http_tps):.2f} |")
    print(f"| ratio serve / bench | {med(http_tps) / med(bench_tps):.3f} |")
    ratios = [h / e for h, e in zip(http_tps, engine_tps)]
    print(f"| same requests, the engine's own count | {med(engine_tps):.2f} |")
    print(f"| ratio HTTP client / engine, same request (median) | {med(ratios):.4f} |")
    print()
    print("| second chat turn | TTFT s (median) | cached / prompt tokens |")
    print("|---|---|---|")
    for label, (t, (c, p)) in ttft.items():
        print(f"| {label} | {t:.3f} | {c} / {p} |")
    print(f"\nper-trial tok/s: bench {[round(x, 2) for x in bench_tps]}, "
          f"serve {[round(x, 2) for x in http_tps]}, engine {[round(x, 2) for x in engine_tps]}")


if __name__ == "__main__":
    main()
