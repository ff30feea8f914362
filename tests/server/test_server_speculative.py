#!/usr/bin/env python3
"""`lmx serve --prompt-lookup N` and `--draft-model DIR`: speculative decoding in the server
(docs/speculative.md). Greedy answers equal the plain ones (the same request with
"speculative": false), also for concurrent requests batched beside the speculative rows; usage
reports the speculation; requests with a constraint or logits processors decode plainly; bad
fields get 400 with a JSON body.

    LMX_BINARY=build/lmx LMX_TEST_DATA=build/testdata .venv/bin/python tests/server/test_server_speculative.py
"""
import os
import sys
import unittest
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import MODEL, Server  # noqa: E402

# Repeats itself: prompt lookup finds earlier n-grams to propose.
PROMPT = ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
          "def mul(a, b):\n    return a * b\n\ndef div(a, b):\n")
MAX = 24


class ServeSpeculativeTest(unittest.TestCase):
    def complete(self, srv, **extra):
        body = {"prompt": PROMPT, "temperature": 0, "max_tokens": MAX, **extra}
        status, r = srv.request("POST", "/v1/completions", body)
        self.assertEqual(status, 200, r)
        return r

    def test_prompt_lookup_equals_plain_and_batches(self):
        srv = Server("--prompt-lookup", "3", "--num-draft-tokens", "4", "--max-batch", "4")
        try:
            plain = self.complete(srv, speculative=False)
            self.assertNotIn("speculative", plain["usage"])
            spec = self.complete(srv)
            self.assertEqual(spec["choices"][0]["text"], plain["choices"][0]["text"])
            sp = spec["usage"]["speculative"]
            self.assertGreater(sp["rounds"], 0)
            self.assertLessEqual(sp["accepted"], sp["drafted"])
            self.assertGreaterEqual(sp["mean_accepted_length"], 1.0)
            # Concurrent: speculative rows beside plain ones, each its own answer.
            other = "The capital of France is"
            alone_other = self.complete(srv, prompt=other, speculative=False)["choices"][0]["text"]
            picks = [{}, {"prompt": other}, {"num_draft_tokens": 2}, {"prompt": other, "speculative": False}]
            with ThreadPoolExecutor(len(picks)) as pool:
                got = list(pool.map(lambda p: self.complete(srv, **p), picks))
            for pick, r in zip(picks, got):
                want = alone_other if "prompt" in pick else plain["choices"][0]["text"]
                self.assertEqual(r["choices"][0]["text"], want, pick)
            # A constraint or a penalty: decoded plainly, no speculation in usage.
            r = self.complete(srv, response_format={"type": "json_object"})
            self.assertNotIn("speculative", r["usage"])
            r = self.complete(srv, repetition_penalty=1.1)
            self.assertNotIn("speculative", r["usage"])
            status, r = srv.request("POST", "/v1/completions",
                                    {"prompt": PROMPT, "max_tokens": 2, "num_draft_tokens": 0})
            self.assertEqual(status, 400, r)
            self.assertIn("num_draft_tokens", r["error"]["message"])
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_self_draft_accepts_everything(self):
        srv = Server("--draft-model", MODEL, "--num-draft-tokens", "3")
        try:
            plain = self.complete(srv, speculative=False)
            spec = self.complete(srv)
            self.assertEqual(spec["choices"][0]["text"], plain["choices"][0]["text"])
            sp = spec["usage"]["speculative"]
            self.assertEqual(sp["accepted"], sp["drafted"], sp)
            self.assertEqual(sp["acceptance_rate"], 1.0)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_num_draft_tokens_needs_speculation(self):
        srv = Server()
        try:
            status, r = srv.request("POST", "/v1/completions",
                                    {"prompt": "hi", "max_tokens": 1, "num_draft_tokens": 2})
            self.assertEqual(status, 400, r)
            self.assertIn("--draft-model", r["error"]["message"])
        finally:
            self.assertEqual(srv.stop(), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
