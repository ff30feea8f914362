#!/usr/bin/env python3
"""Time to first token of a chat's later turns with and without the KV cache kept across turns.

Runs `lmx chat --verbose` twice on the same scripted conversation (greedy, so both runs see the
same prompts): once as is (lmx::Session reuses the cached prefix), once with --no-cache-reuse
(the whole conversation prefilled every turn), and prints a Markdown table for docs/benchmarks.md.

usage: chat_prompt_reuse.py --model DIR [--lmx build/lmx] [--system-words 600] [--turns 3]
"""
import argparse
import platform
import re
import subprocess

QUESTIONS = ["What is the capital of France?", "And what is its most famous monument?",
             "How tall is it?", "When was it built?", "Who designed it?"]
LINE = re.compile(r"\[prompt: (\d+) tokens, (\d+) reused from the cache, (\d+) prefilled, "
                  r"first token after ([\d.]+) s; generation: (\d+) tokens, ([\d.]+) tok/s\]")


def run(lmx, model, system, turns, max_tokens, reuse):
    cmd = [lmx, "chat", "--model", model, "--system", system, "--max-tokens", str(max_tokens),
           "--verbose"] + ([] if reuse else ["--no-cache-reuse"])
    stdin = "\n".join(QUESTIONS[:turns]) + "\n"
    out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=True)
    return [tuple(float(x) for x in m.groups()) for m in LINE.finditer(out.stderr)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--lmx", default="build/lmx")
    ap.add_argument("--system-words", type=int, default=600)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    words = ("You are a helpful assistant who answers questions about geography, history and "
             "architecture accurately and briefly. ").split()
    system = " ".join(words[k % len(words)] for k in range(args.system_words))
    with_reuse = run(args.lmx, args.model, system, args.turns, args.max_tokens, True)
    without = run(args.lmx, args.model, system, args.turns, args.max_tokens, False)
    print(f"machine: {platform.machine()} {platform.node()}, model {args.model}")
    print("| turn | prompt tokens | reused | prefilled | first token (reuse) | prefilled | "
          "first token (no reuse) | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    for k, (a, b) in enumerate(zip(with_reuse, without)):
        print(f"| {k + 1} | {int(a[0])} | {int(a[1])} | {int(a[2])} | {a[3]:.3f} s | {int(b[2])} | "
              f"{b[3]:.3f} s | {b[3] / a[3]:.1f}x |")


if __name__ == "__main__":
    main()
