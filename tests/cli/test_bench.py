#!/usr/bin/env python3
"""lmx bench --concurrency: one JSON line per level with the aggregate and per-stream rates, and,
with --prompt-lookup or --draft-model, the streams' summed speculative counts (each stream
speculates in the scheduler), on the default SmolLM2 model with short streams: the numbers only
have to be there and add up.

    LMX_BINARY=build/lmx LMX_TEST_DATA=build/testdata .venv/bin/python tests/cli/test_bench.py
"""
import json
import os
import subprocess
import unittest
from pathlib import Path

LMX = os.environ["LMX_BINARY"]
MODEL = Path(os.environ["LMX_TEST_DATA"]) / "smollm2-135m-instruct-4bit"


def bench(*args):
    p = subprocess.run([LMX, "bench", "--model", str(MODEL), "--concurrency", "1,3",
                        "--prompt-tokens", "12", "--gen-tokens", "10", "--json", *args],
                       capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        raise AssertionError(f"lmx bench {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


class BenchConcurrency(unittest.TestCase):
    def test_levels_without_speculation(self):
        rows = bench()
        self.assertEqual([r["concurrency"] for r in rows], [1, 3])
        for r in rows:
            self.assertGreater(r["aggregate_tps"], 0)
            self.assertGreater(r["per_stream_tps"], 0)
            self.assertLessEqual(r["ttft_p50_s"], r["ttft_p99_s"])
            self.assertNotIn("speculative", r)

    def test_prompt_concurrency(self):
        rows = bench("--prompt-concurrency", "3")
        self.assertEqual([r["prompt_concurrency"] for r in rows], [3, 3])
        for r in rows:
            self.assertGreater(r["aggregate_tps"], 0)
            self.assertLessEqual(r["ttft_p50_s"], r["ttft_p99_s"])
        p = subprocess.run([LMX, "bench", "--model", str(MODEL), "--concurrency", "2",
                            "--prompt-concurrency", "0"], capture_output=True, text=True)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--prompt-concurrency must be > 0", p.stderr)

    def test_self_draft_is_accepted(self):
        # The model drafting for itself at tier L1: its greedy proposals are the target's tokens.
        rows = bench("--exact", "--draft-model", str(MODEL), "--num-draft-tokens", "3")
        self.assertEqual([r["concurrency"] for r in rows], [1, 3])
        for r in rows:
            s = r["speculative"]
            self.assertGreater(s["drafted"], 0)
            self.assertGreater(s["accepted"], 0)
            self.assertLessEqual(s["accepted"], s["drafted"])
            self.assertGreater(s["mean_accepted_length"], 1.0)
        # Three streams run more verification rounds than one.
        self.assertGreater(rows[1]["speculative"]["rounds"], rows[0]["speculative"]["rounds"])

    def test_prompt_lookup_counts(self):
        rows = bench("--prompt-lookup", "2")
        for r in rows:
            s = r["speculative"]
            self.assertLessEqual(s["accepted"], s["drafted"])
            self.assertGreaterEqual(s["rounds"], 1)


if __name__ == "__main__":
    unittest.main()
