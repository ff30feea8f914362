#!/usr/bin/env python3
"""`lmx serve --adapter-path`: the real binary on the default model with the SmolLM2 adapter of
scripts/gen_lora_fixtures.py; /v1/completions (tier L1, greedy) gives the text mlx_lm.generate
gave with mlx_lm.utils.load(path, adapter_path=...), also when the prompt cache serves the
prompt's prefix, and a server without the adapter gives mlx-lm's base text.

    LMX_BINARY=build/lmx LMX_TEST_DATA=build/testdata .venv/bin/python tests/server/test_server_lora.py
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import Server  # noqa: E402

LORA = os.path.join(os.environ.get("LMX_TEST_DATA", "build/testdata"), "lora", "smollm2")


class ServeLoraTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(LORA, "reference.json")) as f:
            cls.ref = json.load(f)

    def complete(self, srv, cached=None):
        s, r = srv.request("POST", "/v1/completions", {"prompt": self.ref["prompt"], "temperature": 0,
                                                       "max_tokens": self.ref["max_tokens"]})
        self.assertEqual(s, 200, r)
        if cached is not None:
            got = r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
            self.assertEqual(got > 0, cached, r["usage"])
        return r["choices"][0]["text"]

    def test_adapter_text_matches_mlx_lm(self):
        self.assertNotEqual(self.ref["text"], self.ref["base_text"])
        srv = Server("--adapter-path", os.path.join(LORA, "adapter"))
        try:
            self.assertEqual(self.complete(srv, cached=False), self.ref["text"])
            # The second request reuses the cached prompt prefix, computed with the adapter.
            self.assertEqual(self.complete(srv, cached=True), self.ref["text"])
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_base_server_gives_base_text(self):
        srv = Server()
        try:
            self.assertEqual(self.complete(srv), self.ref["base_text"])
        finally:
            self.assertEqual(srv.stop(), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
