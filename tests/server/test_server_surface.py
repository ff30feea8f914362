#!/usr/bin/env python3
"""What `lmx serve` offers beside generation (issue 23): several models in one server (loaded
on first use, least recently used idle one unloaded past --max-loaded-models or
--memory-budget), POST /v1/responses with the official openai client (against the chat
endpoint's answers for the same conversation), and /metrics (Prometheus) and /stats (JSON)
against the requests the test made.

    LMX_BINARY=build/lmx LMX_TEST_DATA=build/testdata .venv/bin/python tests/server/test_server_surface.py
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import (BINARY, EMBED_MODEL, MAX, MODEL, THINK_PROMPT, TOOL_PROMPT,  # noqa: E402
                         TOOLS, Server, chat)

TINY = EMBED_MODEL  # a tiny random Qwen3: the second model


def metrics(srv):
    """{(name, frozenset(labels)): value} from the Prometheus text format, checking its grammar."""
    conn_status, text = srv.request("GET", "/metrics")
    assert conn_status == 200, text
    text = text.decode() if isinstance(text, bytes) else json.dumps(text)
    out, typed = {}, set()
    line_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (-?[0-9.e+-]+|\+Inf|NaN)$')
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("#") or not line:
            continue
        m = line_re.match(line)
        assert m, "not a sample line: " + line
        labels = frozenset(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        name = m.group(1)
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in typed or base in typed, "no TYPE line for " + name
        out[(name, labels)] = float(m.group(4))
    return out


def value(ms, name, **labels):
    return ms.get((name, frozenset(labels.items())), 0.0)


class MultiModelTest(unittest.TestCase):
    def complete(self, srv, model, prompt="Once upon a time", n=4):
        status, r = srv.request("POST", "/v1/completions",
                                {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0})
        self.assertEqual(status, 200, r)
        return r["choices"][0]["text"]

    def test_two_models_load_on_demand_and_stay_within_the_limit(self):
        srv = Server("--model", TINY, "--max-loaded-models", "1", "--served-model-name", "smol")
        try:
            status, r = srv.request("GET", "/v1/models")
            listed = {m["id"]: m["loaded"] for m in r["data"]}
            self.assertEqual(listed, {MODEL: True, TINY: False})
            first = self.complete(srv, MODEL)
            self.assertEqual(self.complete(srv, "smol"), first)  # an alias of the first
            # The short name (the directory's) picks the second; loading it unloads the first.
            tiny = self.complete(srv, os.path.basename(TINY))
            listed = {m["id"]: m["loaded"] for m in srv.request("GET", "/v1/models")[1]["data"]}
            self.assertEqual(listed, {MODEL: False, TINY: True})
            # Back to the first: loaded again, the same answer.
            self.assertEqual(self.complete(srv, MODEL), first)
            self.assertEqual(self.complete(srv, TINY), tiny)
            ms = metrics(srv)
            self.assertEqual(value(ms, "lmx_model_loads_total", model=MODEL), 2)
            # first, tiny (first out), first (tiny out), tiny (first out).
            self.assertEqual(value(ms, "lmx_model_unloads_total", model=MODEL), 2)
            self.assertEqual(value(ms, "lmx_model_unloads_total", model=TINY), 1)
            self.assertEqual(value(ms, "lmx_model_loads_total", model=TINY), 2)
            self.assertEqual(value(ms, "lmx_models_loaded"), 1)
            # An unknown name: 404 naming the ids the server has.
            status, r = srv.request("POST", "/v1/completions", {"model": "nope", "prompt": "x"})
            self.assertEqual(status, 404, r)
            self.assertEqual(r["error"]["code"], "model_not_found")
            self.assertIn(TINY, r["error"]["message"])
            self.assertEqual(srv.request("GET", "/v1/models/nope")[0], 404)
            self.assertEqual(srv.request("GET", "/v1/models/smol")[1]["id"], MODEL)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_models_dir_concurrent_models_and_any_name(self):
        root = tempfile.mkdtemp()
        try:
            os.symlink(os.path.abspath(MODEL), os.path.join(root, "smol"))
            os.symlink(os.path.abspath(TINY), os.path.join(root, "tiny"))
            os.mkdir(os.path.join(root, "not-a-model"))
            srv = Server("--models-dir", root, "--any-model-name", "--max-loaded-models", "3")
            try:
                ids = [m["id"] for m in srv.request("GET", "/v1/models")[1]["data"]]
                self.assertEqual(ids, [MODEL, "smol", "tiny"])
                alone = {m: self.complete(srv, m, n=MAX) for m in ("smol", "tiny")}
                # Both models at once (they take turns per step): each its own answer.
                picks = ["smol", "tiny"] * 3
                with ThreadPoolExecutor(len(picks)) as pool:
                    got = list(pool.map(lambda m: self.complete(srv, m, n=MAX), picks))
                self.assertEqual(got, [alone[m] for m in picks])
                # --any-model-name: an unknown name is the first model.
                self.assertEqual(self.complete(srv, "gpt-4o", n=MAX), self.complete(srv, MODEL, n=MAX))
            finally:
                self.assertEqual(srv.stop(), 0)
        finally:
            shutil.rmtree(root)

    def test_memory_budget(self):
        def weights(d):
            return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
                       if f.endswith(".safetensors"))
        # Room for one SmolLM2 and its requests' KV, not two: loading the second (the same
        # weights under another name) unloads the first although two may be loaded by count.
        root = tempfile.mkdtemp()
        os.symlink(os.path.abspath(MODEL), os.path.join(root, "other"))
        srv = Server("--models-dir", root, "--max-loaded-models", "2", "--memory-budget",
                     "%dB" % (weights(MODEL) + 20_000_000))
        try:
            first = self.complete(srv, MODEL)
            self.assertEqual(self.complete(srv, "other"), first)
            ms = metrics(srv)
            self.assertEqual(value(ms, "lmx_model_unloads_total", model=MODEL), 1)
            self.assertEqual(value(ms, "lmx_models_loaded"), 1)
            self.assertEqual(self.complete(srv, MODEL), first)
        finally:
            self.assertEqual(srv.stop(), 0)
            shutil.rmtree(root)
        # A model larger than the budget: refused with the numbers; a bad value names the flag.
        for budget, message in [("1K", "more than the --memory-budget of 1000 bytes"),
                                ("lots", "--memory-budget must be a size in GB")]:
            p = subprocess.run([BINARY, "serve", "--model", MODEL, "--memory-budget", budget],
                               capture_output=True, text=True, timeout=120)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(message, p.stderr)


class ResponsesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def chat_answer(self, messages, **extra):
        r = self.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX,
                                                temperature=0, **extra)
        return r.choices[0].message.content, r.usage

    def test_text_instructions_and_previous_response(self):
        want, usage = self.chat_answer([{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Name a color."}])
        r = self.client.responses.create(model=MODEL, input="Name a color.", instructions="Be brief.",
                                         max_output_tokens=MAX, temperature=0)
        self.assertEqual(r.object, "response")
        self.assertEqual(r.output_text, want)
        self.assertEqual(r.status, "incomplete")  # MAX tokens is too few to finish
        self.assertEqual(r.incomplete_details.reason, "max_output_tokens")
        self.assertEqual((r.usage.input_tokens, r.usage.output_tokens),
                         (usage.prompt_tokens, usage.completion_tokens))
        # The second turn sees the first (not its instructions, which are not carried over).
        want2, _ = self.chat_answer([{"role": "user", "content": "Name a color."},
                                     {"role": "assistant", "content": want},
                                     {"role": "user", "content": "Another one?"}])
        r2 = self.client.responses.create(model=MODEL, input="Another one?", previous_response_id=r.id,
                                          max_output_tokens=MAX, temperature=0)
        self.assertEqual(r2.output_text, want2)
        self.assertEqual(r2.previous_response_id, r.id)
        # Input items: a message list with content parts is the same conversation.
        r3 = self.client.responses.create(model=MODEL, input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Name a color."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": want}]},
            {"role": "user", "content": "Another one?"}], max_output_tokens=MAX, temperature=0)
        self.assertEqual(r3.output_text, want2)
        # Kept responses: retrieve, delete, then gone; store=False keeps nothing.
        self.assertEqual(self.client.responses.retrieve(r.id).output_text, want)
        self.client.responses.delete(r.id)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.retrieve(r.id)
        r4 = self.client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=False)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.retrieve(r4.id)

    def test_streaming_event_sequence(self):
        want = self.client.responses.create(model=MODEL, input="Count to three.",
                                            max_output_tokens=MAX, temperature=0)
        events = list(self.client.responses.create(model=MODEL, input="Count to three.",
                                                   max_output_tokens=MAX, temperature=0, stream=True))
        types = [e.type for e in events]
        self.assertEqual(types[:4], ["response.created", "response.in_progress",
                                     "response.output_item.added", "response.content_part.added"])
        self.assertEqual(types[-4:], ["response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.incomplete"])
        self.assertEqual([e.sequence_number for e in events], list(range(len(events))))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        self.assertEqual(text, want.output_text)
        self.assertEqual(events[-1].response.output_text, want.output_text)
        self.assertEqual(events[-1].response.usage.output_tokens, want.usage.output_tokens)

    def test_bad_requests(self):
        for body, status, field in [
            ({"model": MODEL}, 400, "input"),
            ({"model": MODEL, "input": "x", "previous_response_id": "resp_nope"}, 404,
             "previous_response_id"),
            ({"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
            ({"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_image"}]}]},
             400, "input[0].content[0].type"),
            ({"model": MODEL, "input": [{"type": "function_call_output"}]}, 400, "input[0].call_id"),
            ({"model": MODEL, "input": "x", "temperature": -1}, 400, "temperature"),
        ]:
            s, r = self.server.request("POST", "/v1/responses", body)
            self.assertEqual(s, status, (body, r))
            self.assertEqual(r["error"]["param"], field, r)


class ResponsesToolsTest(unittest.TestCase):
    """Function tools and reasoning through /v1/responses, against the chat endpoint."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--chat-template",
                            "{% if mode == 'think' %}{% raw %}" + THINK_PROMPT + "{% endraw %}"
                            "{% else %}{% raw %}" + TOOL_PROMPT + "{% endraw %}{% endif %}")
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_function_call_items(self):
        call = self.client.chat.completions.create(
            model=MODEL, messages=chat("weather?"), tools=TOOLS, max_tokens=40, stop=["\n"],
            temperature=0).choices[0].message.tool_calls[0]
        tools = [{"type": "function", **t["function"]} for t in TOOLS]
        r = self.client.responses.create(model=MODEL, input="weather?", tools=tools,
                                         max_output_tokens=40, temperature=0,
                                         extra_body={"stop": ["\n"]})
        calls = [o for o in r.output if o.type == "function_call"]
        self.assertEqual([(c.name, json.loads(c.arguments)) for c in calls],
                         [(call.function.name, json.loads(call.function.arguments))])
        events = list(self.client.responses.create(model=MODEL, input="weather?", tools=tools,
                                                   max_output_tokens=40, temperature=0, stream=True))
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        self.assertEqual([json.loads(e.arguments) for e in done], [json.loads(call.function.arguments)])
        # The call's output goes back as an item: the next turn is accepted and answered.
        r2 = self.client.responses.create(model=MODEL, previous_response_id=r.id, input=[
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}],
            tools=tools, max_output_tokens=4, temperature=0)
        self.assertIn(r2.status, ("completed", "incomplete"))

    def test_reasoning_item(self):
        m = self.client.chat.completions.create(
            model=MODEL, messages=chat("dessert?"), max_tokens=24, stop=["\n"], temperature=0,
            extra_body={"chat_template_kwargs": {"mode": "think"}}).choices[0].message
        r = self.client.responses.create(model=MODEL, input="dessert?", max_output_tokens=24,
                                         temperature=0, extra_body={
                                             "stop": ["\n"], "chat_template_kwargs": {"mode": "think"}})
        self.assertEqual([o.type for o in r.output], ["reasoning", "message"])
        self.assertEqual(r.output[0].content[0].text, m.reasoning_content)
        self.assertEqual(r.output_text, m.content)


class LimitsTest(unittest.TestCase):
    def test_request_timeout(self):
        srv = Server("--request-timeout", "1")
        try:
            body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}
            status, r = srv.request("POST", "/v1/completions", body)
            self.assertEqual(status, 408, r)
            self.assertEqual(r["error"]["code"], "request_timeout")
            self.assertIn("--request-timeout", r["error"]["message"])
            # Streamed: an error event ends the stream.
            status, raw = srv.request("POST", "/v1/completions", {**body, "stream": True})
            self.assertEqual(status, 200)
            self.assertIn(b"request-timeout", raw if isinstance(raw, bytes) else json.dumps(raw).encode())
            # The server goes on.
            status, r = srv.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
            self.assertEqual(status, 200, r)
            self.assertIn("lmx_http_requests_total", srv.request("GET", "/metrics")[1].decode())
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_client_gone_while_queued_leaves_the_queue(self):
        import socket
        import threading
        import time
        # One row, one queue place: A runs, B waits; B's client closes; C must then find the
        # queue place free (a 429 would mean B still holds it).
        srv = Server("--max-batch", "1", "--max-queue", "1")
        try:
            long_body = {"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True}
            a = threading.Thread(target=srv.request, args=("POST", "/v1/completions", long_body))
            a.start()
            deadline = time.time() + 60
            while value(metrics(srv), "lmx_active_rows", model=MODEL) < 1:
                self.assertLess(time.time(), deadline)
                time.sleep(0.1)
            data = json.dumps({"prompt": "Hello", "max_tokens": 4}).encode()
            b = socket.create_connection(("127.0.0.1", srv.port))
            b.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(data) + data)
            while value(metrics(srv), "lmx_queue_depth", model=MODEL) < 1:
                self.assertLess(time.time(), deadline)
                time.sleep(0.1)
            b.close()
            while value(metrics(srv), "lmx_queue_depth", model=MODEL) > 0:
                self.assertLess(time.time(), deadline, "the closed request stayed queued")
                time.sleep(0.1)
            self.assertEqual(value(metrics(srv), "lmx_active_rows", model=MODEL), 1)  # A still runs
            status, r = srv.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
            self.assertEqual(status, 200, r)
            a.join()
        finally:
            self.assertEqual(srv.stop(), 0)


class MetricsTest(unittest.TestCase):
    def test_counters_match_the_requests_made(self):
        srv = Server()
        try:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
            usages = []
            for prompt in ["Hello there", "Hello there", "What is 2+2?"]:
                r = client.chat.completions.create(model=MODEL, messages=chat(prompt),
                                                   max_tokens=MAX, temperature=0)
                usages.append(r.usage)
            chunks = list(client.chat.completions.create(
                model=MODEL, messages=chat("Hi"), max_tokens=3, stream=True,
                stream_options={"include_usage": True}))
            self.assertEqual(chunks[-1].usage.completion_tokens, 3)
            usages.append(chunks[-1].usage)
            self.assertEqual(srv.request("POST", "/v1/completions", {"prompt": ""})[0], 400)
            # A request is counted once its last byte is written, which the client of a stream
            # can read before the server's thread gets there: wait for it (at most 10 s).
            deadline = time.time() + 10
            while True:
                ms = metrics(srv)
                done = value(ms, "lmx_http_requests_total", method="POST",
                             route="/v1/chat/completions", status="200")
                if done == 4 or time.time() > deadline:
                    break
                time.sleep(0.05)
            self.assertEqual(done, 4)
            self.assertEqual(value(ms, "lmx_http_requests_total", method="POST",
                                   route="/v1/completions", status="400"), 1)
            generated = sum(u.completion_tokens for u in usages)
            self.assertEqual(value(ms, "lmx_generation_tokens_total", model=MODEL), generated)
            self.assertEqual(value(ms, "lmx_time_to_first_token_seconds_count"), 4)
            self.assertEqual(value(ms, "lmx_inter_token_latency_seconds_count"), generated - 4)
            self.assertEqual(value(ms, "lmx_time_to_first_token_seconds_bucket", le="+Inf"), 4)
            # The repeated prompt reused the first one's cache.
            self.assertGreaterEqual(value(ms, "lmx_prompt_cache_hits_total", model=MODEL), 1)
            self.assertEqual(value(ms, "lmx_prompt_cache_reused_tokens_total", model=MODEL),
                             sum(u.prompt_tokens_details.cached_tokens for u in usages))
            self.assertGreater(value(ms, "lmx_prompt_cache_bytes", model=MODEL), 0)
            self.assertEqual(value(ms, "lmx_active_rows", model=MODEL), 0)
            self.assertEqual(value(ms, "lmx_queue_depth", model=MODEL), 0)
            status, st = srv.request("GET", "/stats")
            self.assertEqual(status, 200)
            self.assertEqual(st["tokens"][MODEL]["generated"], generated)
            self.assertEqual(st["time_to_first_token_seconds"]["count"], 4)
            self.assertEqual(st["models"][0]["model"], MODEL)
        finally:
            self.assertEqual(srv.stop(), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
