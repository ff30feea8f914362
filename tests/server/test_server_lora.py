#!/usr/bin/env python3
"""`lmx serve --adapter-path`: the real binary on the default model with the SmolLM2 adapter of
scripts/gen_lora_fixtures.py; /v1/completions (tier L1, greedy) gives the text mlx_lm.generate
gave with mlx_lm.utils.load(path, adapter_path=...), also when the prompt cache serves the
prompt's prefix, and a server without the adapter gives mlx-lm's base text. Adapters chosen per
request (--adapter NAME=DIR, --adapter-root, /v1/adapters): concurrent requests with and without
the adapter, batched together, each get mlx-lm's text for their choice; bad choices get 403, 404
and 409 with JSON bodies.

    LMX_BINARY=build/lmx LMX_TEST_DATA=build/testdata .venv/bin/python tests/server/test_server_lora.py
"""
import json
import os
import shutil
import sys
import tempfile
import unittest
from concurrent.futures import ThreadPoolExecutor

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

    def test_per_request_adapters_batched(self):
        adapter = os.path.join(LORA, "adapter")
        root = tempfile.mkdtemp(prefix="lmx_adapters_")
        copy = os.path.join(root, "copy")
        shutil.copytree(adapter, copy)
        os.mkdir(os.path.join(root, "empty"))
        srv = Server("--adapter", "tuned=" + adapter, "--adapter-root", root, "--max-batch", "4")
        try:
            def text(extra):
                body = {"prompt": self.ref["prompt"], "temperature": 0,
                        "max_tokens": self.ref["max_tokens"], **extra}
                return srv.request("POST", "/v1/completions", body)

            # By name, by model name, by directory (loaded on first use, under the root), none.
            picks = [{"adapter": "tuned"}, {}, {"model": "tuned"}, {"adapters": copy},
                     {"adapter": "tuned"}, {}]
            with ThreadPoolExecutor(len(picks)) as pool:
                results = list(pool.map(text, picks))
            for pick, (status, r) in zip(picks, results):
                self.assertEqual(status, 200, (pick, r))
                want = self.ref["base_text"] if not pick else self.ref["text"]
                self.assertEqual(r["choices"][0]["text"], want, pick)

            status, listed = srv.request("GET", "/v1/adapters")
            self.assertEqual(status, 200, listed)
            self.assertEqual(sorted(a["id"] for a in listed["data"]),
                             sorted(["tuned", os.path.realpath(copy)]))
            status, models = srv.request("GET", "/v1/models")
            cards = {m["id"]: m for m in models["data"]}
            self.assertIn("parent", cards["tuned"])

            # Loaded and unloaded at run time.
            status, r = srv.request("POST", "/v1/adapters", {"id": "t2", "path": copy})
            self.assertEqual(status, 200, r)
            self.assertEqual(r["id"], "t2")
            self.assertGreater(r["modules"], 0)
            status, r = text({"adapter": "t2"})
            self.assertEqual(status, 200, r)
            self.assertEqual(r["choices"][0]["text"], self.ref["text"])
            status, r = srv.request("POST", "/v1/adapters", {"id": "t2", "path": copy})
            self.assertEqual(status, 409, r)
            status, r = srv.request("DELETE", "/v1/adapters/t2")
            self.assertEqual((status, r.get("deleted")), (200, True), r)
            status, r = text({"adapter": "t2"})
            self.assertEqual(status, 404, r)
            self.assertIn("t2", r["error"]["message"])
            status, r = srv.request("DELETE", "/v1/adapters/t2")
            self.assertEqual(status, 404, r)

            # Outside the root (the CLI adapter's own directory included): 403, nothing loaded.
            for path in (LORA, tempfile.gettempdir()):
                status, r = srv.request("POST", "/v1/adapters", {"id": "x", "path": path})
                self.assertEqual(status, 403, r)
                self.assertIn("adapter-root", r["error"]["message"])
            with tempfile.TemporaryDirectory() as outside:
                status, r = text({"adapters": outside})
                self.assertEqual(status, 403, r)
            # Under the root but not an adapter: 400 naming the file; no id: 400.
            status, r = srv.request("POST", "/v1/adapters", {"id": "y", "path": os.path.join(root, "empty")})
            self.assertEqual(status, 400, r)
            self.assertIn("adapter_config.json", r["error"]["message"])
            status, r = srv.request("POST", "/v1/adapters", {"path": copy})
            self.assertEqual(status, 400, r)
            status, listed = srv.request("GET", "/v1/adapters")
            self.assertEqual(len(listed["data"]), 2, listed)
        finally:
            self.assertEqual(srv.stop(), 0)
            shutil.rmtree(root, ignore_errors=True)

    def test_run_time_loading_is_off_without_a_root(self):
        srv = Server()
        try:
            status, r = srv.request("POST", "/v1/adapters", {"id": "t", "path": os.path.join(LORA, "adapter")})
            self.assertEqual(status, 403, r)
            status, r = srv.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 1,
                                                                "adapter": "nope"})
            self.assertEqual(status, 404, r)
            self.assertEqual(r["error"]["code"], "adapter_not_found")
        finally:
            self.assertEqual(srv.stop(), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
