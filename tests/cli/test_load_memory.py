#!/usr/bin/env python3
"""Loading a model holds its weights once: the peak RSS of `lmx generate` on the converted SmolLM2
(one token, tier L1) stays under 1.4 times the bytes of its model*.safetensors above the peak of
`lmx fit` on the same model (same binary and libraries, headers read, no weights). MLX's CPU
allocator copies every tensor out of the mapped file; before the mapped pages were released after
each copy, a load held both the file's pages and the copies (1.96x measured, docs/memory.md).

    LMX_BINARY=build/lmx LMX_TEST_DATA=build/testdata .venv/bin/python tests/cli/test_load_memory.py
"""
import os
import subprocess
import unittest
from pathlib import Path

LMX = os.environ["LMX_BINARY"]
MODEL = Path(os.environ["LMX_TEST_DATA"]) / "smollm2-135m-instruct-4bit"


def peak_rss_bytes(args):
    """The child's exit status and peak RSS in bytes (wait4's ru_maxrss, KiB on Linux)."""
    p = subprocess.Popen([LMX, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    err = p.stderr.read().decode()
    p.stderr.close()
    return os.waitstatus_to_exitcode(status), ru.ru_maxrss * 1024, err


class LoadMemory(unittest.TestCase):
    def test_weights_held_once(self):
        weights = sum(f.stat().st_size for f in MODEL.glob("model*.safetensors"))
        self.assertGreater(weights, 50_000_000, "the fixture should be the 4-bit SmolLM2 (~115 MB)")
        rc, base, err = peak_rss_bytes(["fit", "--model", str(MODEL)])
        self.assertEqual(rc, 0, err)
        rc, peak, err = peak_rss_bytes(["generate", "--model", str(MODEL), "--exact", "--prompt",
                                        "Hello", "--max-tokens", "1"])
        self.assertEqual(rc, 0, err)
        ratio = (peak - base) / weights
        print(f"weights {weights / 1e6:.1f} MB, fit peak {base / 1e6:.1f} MB, generate peak "
              f"{peak / 1e6:.1f} MB: {ratio:.2f}x the weights above fit")
        self.assertLess(ratio, 1.4)


if __name__ == "__main__":
    unittest.main()
