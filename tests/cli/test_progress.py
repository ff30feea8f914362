#!/usr/bin/env python3
"""Progress lines (src/core/progress.h) of lmx convert and of long prefills with generate
--verbose, standard error being a pipe here: plain lines (no carriage return, no bar), the last
one at 100% with the totals: the bytes of the tensors convert wrote (summed from the output
files by mx.load) and the prompt tokens prefilled before the last one (the tokenizer's count).

    LMX_BINARY=build/lmx LMX_TEST_DATA=build/testdata .venv/bin/python tests/cli/test_progress.py
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hub"))
from test_hub import fmt_bytes  # noqa: E402

LMX = os.environ["LMX_BINARY"]
DATA = Path(os.environ["LMX_TEST_DATA"])
MODEL = DATA / "smollm2-135m-instruct-4bit"


class ProgressLines(unittest.TestCase):
    def test_convert(self):
        src = DATA / "convert" / "hf" / "llama_bf16_tied" / "src"
        with tempfile.TemporaryDirectory() as tmp:
            dst = Path(tmp) / "out"
            p = subprocess.run([LMX, "convert", "--hf-path", str(src), "--mlx-path", str(dst), "-q"],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertNotIn("\r", p.stderr)
            lines = [l for l in p.stderr.splitlines() if l.startswith("converting")]
            self.assertTrue(lines, p.stderr)
            total = sum(a.nbytes for f in dst.glob("model*.safetensors")
                        for a in mx.load(str(f)).values())
            want = f"100% {fmt_bytes(total)} / {fmt_bytes(total)}"
            self.assertIn(want, lines[-1])
            self.assertRegex(lines[-1], r"/s  in \d+:\d\d$")
            p = subprocess.run([LMX, "convert", "--hf-path", str(src), "--mlx-path",
                                str(Path(tmp) / "quiet"), "--quiet"], capture_output=True,
                               text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertEqual(p.stderr, "")

    def test_long_prefill_with_verbose(self):
        prompt = "The quick brown fox jumps over the lazy dog. " * 12
        n = len(AutoTokenizer.from_pretrained(str(MODEL)).encode(prompt))
        p = subprocess.run([LMX, "generate", "--model", str(MODEL), "--prompt", prompt,
                            "--max-tokens", "1", "--prefill-step-size", "16", "--verbose"],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("\r", p.stderr)
        lines = [l for l in p.stderr.splitlines() if l.startswith("prefill")]
        self.assertTrue(lines, p.stderr)
        self.assertRegex(lines[-1], rf"^prefill +100% {n - 1} tokens / {n - 1} tokens  "
                                    r"[0-9.]+ tokens/s  in \d+:\d\d$")
        self.assertIn(f"prompt: {n} tokens", p.stderr)
        # One chunk: no progress line.
        p = subprocess.run([LMX, "generate", "--model", str(MODEL), "--prompt", "Hi",
                            "--max-tokens", "1", "--verbose"], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("prefill", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
