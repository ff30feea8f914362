#!/usr/bin/env python3
"""`lmx lora -c config.yaml` on the tiny llama of scripts/gen_train_fixtures.py (rows
llama_f32_text: LoRA, llama_f32_full: --fine-tune-type full; mlx_lm.lora's arguments written as
YAML), then the adapter lmx saved loaded by mlx_lm.load(model, adapter_path=...): its logits equal
the reference's (mlx-lm's own adapter from the same run), bit for bit, and the adapter tensors
equal mlx-lm's."""

import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load

ROOT = Path(os.environ.get("LMX_TEST_DATA", "build/testdata")) / "train"
LMX = os.environ.get("LMX_BINARY", "build/lmx")


class MlxLoadsLmxAdapter(unittest.TestCase):
    def test_logits(self):
        self.check_row(ROOT / "llama_f32_text")

    def test_full_fine_tune_logits(self):
        self.check_row(ROOT / "llama_f32_full")

    def check_row(self, DATA):
        ref = json.loads((DATA / "reference.json").read_text())
        with tempfile.TemporaryDirectory() as tmp:
            adapter = Path(tmp) / "adapter"
            args = dict(ref["args"], model=str(DATA / "model"), data=str(DATA / "data"),
                        adapter_path=str(adapter), test=False)
            # JSON values are YAML flow values: one `key: value` line each.
            cfg = Path(tmp) / "config.yaml"
            cfg.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in args.items()))
            out = subprocess.run([LMX, "lora", "-c", str(cfg)], capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("Iter 20: Train loss", out.stdout)
            ours = mx.load(str(adapter / "adapters.safetensors"))
            theirs = mx.load(str(DATA / "adapters" / "adapters.safetensors"))
            self.assertEqual(sorted(ours), sorted(theirs))
            for k in theirs:
                self.assertTrue(mx.array_equal(ours[k], theirs[k]).item(), k)
            model, _ = load(str(DATA / "model"), adapter_path=str(adapter))
            want = mx.load(str(DATA / "reference.safetensors"))
            logits = model(want["tokens"]).astype(mx.float32)
            self.assertTrue(mx.array_equal(logits, want["logits"]).item())


if __name__ == "__main__":
    sys.exit(unittest.main())
