#!/usr/bin/env python3
"""End-to-end tests of `lmx serve`: spawn the real binary on the default model (SmolLM2-135M-
Instruct 4-bit) on a free port and drive it with the official `openai` and `anthropic` clients
and raw HTTP. The reference for every greedy output is mlx_lm itself (stream_generate on the
prompt that transformers' apply_chat_template renders), run in this process.

    LMX_BINARY=build/lmx LMX_TEST_DATA=build/testdata .venv/bin/python tests/server/test_server.py
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

import anthropic
import jsonschema
import numpy as np
import openai

BINARY = os.environ.get("LMX_BINARY", "build/lmx")
DATA = os.environ.get("LMX_TEST_DATA", "build/testdata")
MODEL = os.path.join(DATA, "smollm2-135m-instruct-4bit")
# A tiny random Qwen3 checkpoint and mlx-lm's Qwen3-Embedding vectors of its texts
# (scripts/gen_embed_fixtures.py).
EMBED_MODEL = os.path.join(DATA, "embed", "qwen3_embed_bf16")
MAX = 6  # the model runs ~7 tokens/s on the CI CPU: keep answers short
# scripts/gen_lora_fixtures.py's SmolLM2 adapter and mlx-lm's text with it; the shared server
# loads it as "tuned" for requests that ask for it (continuous batching with per-request adapters).
LORA = os.path.join(DATA, "lora", "smollm2")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *flags, model=MODEL, exact=True):
        self.port = free_port()
        # A file, not a pipe: a full pipe nobody reads would block the server's logging.
        self.log = tempfile.TemporaryFile()
        tier = ["--exact"] if exact else []
        self.proc = subprocess.Popen([BINARY, "serve", *tier, "--model", model, "--port", str(self.port),
                                      *flags], stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError("lmx serve exited: " + self.log.read().decode())
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("lmx serve did not come up")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def request(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json",
                                                        **(headers or {})})
        r = conn.getresponse()
        raw = r.read()
        conn.close()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, raw

    def log_text(self):
        # pread: the server shares the file's offset, which a seek would move.
        fd = self.log.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)
        self.log.close()
        return self.proc.returncode


class Reference:
    """mlx_lm's greedy output for a chat or a raw prompt."""

    def __init__(self):
        from mlx_lm import load
        self.model, self.tok = load(MODEL)

    def prompt_ids(self, messages):
        return self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)

    def greedy(self, ids, max_tokens=MAX):
        from mlx_lm.generate import stream_generate
        toks = []
        for r in stream_generate(self.model, self.tok, ids, max_tokens=max_tokens):
            if r.token in self.tok.eos_token_ids:
                break
            toks.append(r.token)
        return self.tok.decode(toks), toks


_reference = None


def reference():
    global _reference
    if _reference is None:
        _reference = Reference()
    return _reference


def chat(q):
    return [{"role": "user", "content": q}]


class ServeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ref = reference()
        cls.server = Server("--max-tokens", str(MAX), "--adapter",
                            "tuned=" + os.path.join(LORA, "adapter"))
        cls.oai = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none")
        cls.claude = anthropic.Anthropic(base_url=cls.server.url, api_key="none")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_health_and_models(self):
        self.assertEqual(self.server.request("GET", "/health"), (200, {"status": "ok"}))
        models = self.oai.models.list().data
        self.assertEqual([m.id for m in models], [MODEL, "tuned"])
        self.assertEqual(self.oai.models.retrieve(MODEL).id, MODEL)
        with self.assertRaises(openai.NotFoundError):
            self.oai.models.retrieve("no-such-model")

    def test_completion_matches_mlx_lm(self):
        with open(os.path.join(os.path.dirname(MODEL), "golden", "golden.json")) as f:
            golden = json.load(f)
        case = golden["cases"][2]
        want, _ = self.ref.greedy(self.ref.tok.encode(case["prompt"]), 8)
        r = self.oai.completions.create(model=MODEL, prompt=case["prompt"], max_tokens=8,
                                        temperature=0)
        self.assertEqual(r.choices[0].text, want)
        self.assertEqual(r.usage.prompt_tokens, len(self.ref.tok.encode(case["prompt"])))
        self.assertEqual(r.usage.completion_tokens, 8)
        self.assertEqual(r.choices[0].finish_reason, "length")
        streamed = "".join(c.choices[0].text for c in self.oai.completions.create(
            model=MODEL, prompt=case["prompt"], max_tokens=8, temperature=0, stream=True)
            if c.choices)
        self.assertEqual(streamed, want)

    def test_chat_stream_and_non_stream_match_mlx_lm(self):
        msgs = chat("What is the capital of France?")
        want, toks = self.ref.greedy(self.ref.prompt_ids(msgs))
        r = self.oai.chat.completions.create(model=MODEL, messages=msgs, temperature=0)
        self.assertEqual(r.choices[0].message.content, want)
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertEqual(r.usage.prompt_tokens, len(self.ref.prompt_ids(msgs)))
        self.assertEqual(r.usage.completion_tokens, len(toks))
        chunks = list(self.oai.chat.completions.create(
            model=MODEL, messages=msgs, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, want)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        self.assertEqual(finishes[-1], "length" if len(toks) == MAX else "stop")
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, len(toks))
        # The same request again: its whole prompt but the last token comes from the cache.
        self.assertGreater(chunks[-1].usage.prompt_tokens_details.cached_tokens, 0)

    def test_stop_string_cuts_the_text(self):
        msgs = chat("Name three colors.")
        want, _ = self.ref.greedy(self.ref.prompt_ids(msgs), 12)
        stop = want[len(want) // 2: len(want) // 2 + 3]
        self.assertTrue(stop.strip(), want)
        cut = want[:want.find(stop)]
        for stream in (False, True):
            r = self.oai.chat.completions.create(model=MODEL, messages=msgs, temperature=0,
                                                 max_tokens=12, stop=[stop], stream=stream)
            if stream:
                chunks = list(r)
                text = "".join(c.choices[0].delta.content or "" for c in chunks)
                finish = chunks[-1].choices[0].finish_reason
            else:
                text, finish = r.choices[0].message.content or "", r.choices[0].finish_reason
            self.assertEqual(text, cut, f"stream={stream} stop={stop!r}")
            self.assertEqual(finish, "stop")

    def test_logprobs_match_mlx_lm(self):
        import mlx.core as mx
        msgs = chat("Say hi.")
        ids = self.ref.prompt_ids(msgs)
        logits = self.ref.model(mx.array([ids]))[0, -1].astype(mx.float32)
        lp = logits - mx.logsumexp(logits)
        order = mx.argsort(-lp).tolist()[:3]
        r = self.oai.chat.completions.create(model=MODEL, messages=msgs, temperature=0,
                                             max_tokens=2, logprobs=True, top_logprobs=3)
        first = r.choices[0].logprobs.content[0]
        self.assertEqual([t.token for t in first.top_logprobs],
                         [self.ref.tok.decode([i]) for i in order])
        for t, i in zip(first.top_logprobs, order):
            self.assertAlmostEqual(t.logprob, lp[i].item(), places=3)
        self.assertEqual(first.token, first.top_logprobs[0].token)

    def test_anthropic_messages(self):
        msgs = chat("What is the capital of France?")
        want, toks = self.ref.greedy(self.ref.prompt_ids(msgs))
        m = self.claude.messages.create(model=MODEL, max_tokens=MAX, messages=msgs)
        self.assertEqual(m.content[0].type, "text")
        self.assertEqual(m.content[0].text, want)
        self.assertEqual(m.stop_reason, "max_tokens" if len(toks) == MAX else "end_turn")
        self.assertEqual(m.usage.output_tokens, len(toks))
        self.assertEqual(self.claude.messages.count_tokens(model=MODEL, messages=msgs)
                         .input_tokens, len(self.ref.prompt_ids(msgs)))
        with self.claude.messages.stream(model=MODEL, max_tokens=MAX, messages=msgs) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        self.assertEqual(text, want)
        self.assertEqual(final.stop_reason, m.stop_reason)
        # The raw event grammar.
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=300)
        conn.request("POST", "/v1/messages", json.dumps(
            {"model": MODEL, "max_tokens": 3, "messages": msgs, "stream": True}),
            {"Content-Type": "application/json"})
        events = [l[7:] for l in conn.getresponse().read().decode().splitlines()
                  if l.startswith("event: ")]
        conn.close()
        self.assertEqual(events[0], "message_start")
        self.assertEqual(events[1], "content_block_start")
        self.assertEqual(events[-3:], ["content_block_stop", "message_delta", "message_stop"])
        self.assertEqual(set(events[2:-3]), {"content_block_delta"})

    def test_system_blocks_tools_and_tool_results_render(self):
        sys_prompt = "You are terse."
        msgs = [{"role": "user", "content": "Weather in Oslo?"}]
        want, _ = self.ref.greedy(self.ref.prompt_ids(
            [{"role": "system", "content": sys_prompt}] + msgs))
        m = self.claude.messages.create(
            model=MODEL, max_tokens=MAX, messages=msgs,
            system=[{"type": "text", "text": sys_prompt}])
        self.assertEqual(m.content[0].text, want)
        tools = [{"type": "function", "function": {
            "name": "weather", "description": "weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
        history = msgs + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "cold"}]
        r = self.oai.chat.completions.create(model=MODEL, messages=history, tools=tools,
                                             temperature=0)
        self.assertIn(r.choices[0].finish_reason, ("stop", "length", "tool_calls"))
        m = self.claude.messages.create(model=MODEL, max_tokens=MAX, messages=[
            msgs[0],
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "weather",
                                                "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                           "content": "cold"}]}],
            tools=[{"name": "weather", "input_schema": tools[0]["function"]["parameters"]}])
        self.assertEqual(m.role, "assistant")

    def test_errors(self):
        body = {"model": MODEL, "messages": chat("x")}
        s, e = self.server.request("POST", "/v1/chat/completions", {**body, "temperature": "hot"})
        self.assertEqual((s, e["error"]["param"]), (400, "temperature"))
        self.assertIn("temperature", e["error"]["message"])
        for field, value in (("messages", []), ("top_p", 2), ("max_tokens", -1),
                             ("logit_bias", {"999999": 1}), ("stop", 5)):
            s, e = self.server.request("POST", "/v1/chat/completions", {**body, field: value})
            self.assertEqual((s, e["error"]["param"]), (400, field), e)
        s, e = self.server.request("POST", "/v1/chat/completions", b"{not json")
        self.assertEqual(s, 400)
        self.assertEqual(self.server.request("POST", "/v1/nothing", body)[0], 404)
        s, e = self.server.request("POST", "/v1/chat/completions", {**body, "model": "gpt-9"})
        self.assertEqual((s, e["error"]["param"], e["error"]["code"]),
                         (404, "model", "model_not_found"))
        s, e = self.server.request("POST", "/v1/completions",
                                   {"prompt": "hi", "max_tokens": 10_000_000})
        self.assertEqual((s, e["error"]["code"]), (400, "context_length_exceeded"))
        with self.assertRaises(openai.BadRequestError) as cm:
            self.oai.chat.completions.create(model=MODEL, messages=chat("x"),
                                             extra_body={"top_k": -3})
        self.assertEqual(cm.exception.body["param"], "top_k")
        s, e = self.server.request("POST", "/v1/messages", {"messages": chat("x")})
        self.assertEqual((s, e["type"], e["error"]["type"]), (400, "error", "invalid_request_error"))

    def test_response_format_json_schema(self):
        # Greedy answers under each schema: they must parse and validate (jsonschema), streamed
        # the same as not.
        schemas = [
            {"type": "object", "properties": {
                "city": {"enum": ["Paris", "London", "Berlin"]},
                "capital": {"type": "boolean"}}, "required": ["city", "capital"]},
            {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3},
            {"type": "object", "properties": {
                "tag": {"type": "string", "minLength": 1, "maxLength": 4},
                "owner": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/id"}]}},
             "required": ["tag", "owner"], "$defs": {"id": {"type": "integer"}}},
        ]
        msgs = chat("Answer in JSON: which city is the capital of France?")
        for i, schema in enumerate(schemas):
            rf = {"type": "json_schema",
                  "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
            r = self.oai.chat.completions.create(model=MODEL, messages=msgs, temperature=0,
                                                 max_tokens=48, response_format=rf)
            text = r.choices[0].message.content
            self.assertEqual(r.choices[0].finish_reason, "stop", text)
            jsonschema.validate(json.loads(text), schema)
            if i == 0:
                chunks = list(self.oai.chat.completions.create(
                    model=MODEL, messages=msgs, temperature=0, max_tokens=48,
                    response_format=rf, stream=True))
                self.assertEqual("".join(c.choices[0].delta.content or "" for c in chunks), text)
                self.assertEqual(chunks[-1].choices[0].finish_reason, "stop")
        # json_object, and /v1/completions, sampled with a seed.
        r = self.oai.chat.completions.create(model=MODEL, messages=msgs, temperature=0,
                                             max_tokens=16, response_format={"type": "json_object"})
        text = r.choices[0].message.content
        if r.choices[0].finish_reason == "stop":
            self.assertIsInstance(json.loads(text), dict)
        else:  # json_object bounds no length: only a cut-off value may fail to parse
            self.assertEqual(r.usage.completion_tokens, 16, text)
        r = self.oai.completions.create(model=MODEL, prompt="Two numbers:", max_tokens=24,
                                        temperature=0.7, seed=3,
                                        extra_body={"response_format": {
                                            "type": "json_schema",
                                            "json_schema": {"name": "n", "schema": schemas[1]}}})
        self.assertEqual(r.choices[0].finish_reason, "stop", r.choices[0].text)
        jsonschema.validate(json.loads(r.choices[0].text), schemas[1])

    def test_response_format_errors(self):
        bad = {"type": "object", "properties": {"zip": {"type": "string", "pattern": "[0-9]+"}}}
        with self.assertRaises(openai.BadRequestError) as cm:
            self.oai.chat.completions.create(
                model=MODEL, messages=chat("x"),
                response_format={"type": "json_schema", "json_schema": {"name": "z", "schema": bad}})
        self.assertEqual(cm.exception.body["param"], "response_format.json_schema.schema")
        self.assertIn("unsupported keyword 'pattern' at #/properties/zip",
                      cm.exception.body["message"])
        for rf, param in (({"type": "yaml"}, "response_format.type"),
                          ({"type": "json_schema"}, "response_format.json_schema"),
                          ({"type": "json_schema", "json_schema": {"schema": {"minimum": 1}}},
                           "response_format.json_schema.schema")):
            s, e = self.server.request("POST", "/v1/chat/completions",
                                       {"messages": chat("x"), "response_format": rf})
            self.assertEqual((s, e["error"]["param"]), (400, param), e)
        # This model's template names no tool-call format: forcing a call is refused.
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            with self.assertRaises(openai.BadRequestError) as cm:
                self.oai.chat.completions.create(model=MODEL, messages=chat("x"), tools=TOOLS,
                                                 tool_choice=choice)
            self.assertEqual(cm.exception.body["param"], "tool_choice")
            self.assertIn("hermes and llama3", cm.exception.body["message"])

    def test_embeddings_of_a_chat_model(self):
        # Served for any model: the final norm's state at the last token, normalized (what
        # mlx_lm's model.model returns), on the text plus the end-of-text token.
        import mlx.core as mx
        ids = self.ref.tok.encode("Paris") + [self.ref.tok.convert_tokens_to_ids("<|endoftext|>")]
        h = self.ref.model.model(mx.array([ids]))[0, -1].astype(mx.float32)
        want = np.array(h / mx.linalg.norm(h))
        r = self.oai.embeddings.create(model=MODEL, input="Paris")
        np.testing.assert_array_equal(np.array(r.data[0].embedding, dtype=np.float32), want)
        self.assertEqual(r.usage.prompt_tokens, len(ids))

    def test_concurrent_clients_match_serial(self):
        prompts = [f"Count to {i}." for i in range(16)]
        ask = lambda p: self.oai.chat.completions.create(
            model=MODEL, messages=chat(p), temperature=0, max_tokens=4).choices[0].message.content
        serial = [ask(p) for p in prompts]
        with ThreadPoolExecutor(16) as pool:
            parallel = list(pool.map(ask, prompts))
        self.assertEqual(parallel, serial)

    def test_mixed_concurrent_requests_match_alone(self):
        # 32 requests of every kind at once (continuous batching): stream and not, logprobs,
        # stop strings, response_format (a JSON-schema constraint), tools, seeded sampling,
        # Anthropic, a LoRA adapter; each gets what it gets when sent alone.
        def oai_chat(i, stream, **kw):
            def run():
                msgs = chat(f"Tell me fact number {i} about the sea.")
                r = self.oai.chat.completions.create(model=MODEL, messages=msgs, stream=stream,
                                                     **kw)
                if stream:
                    return "".join(c.choices[0].delta.content or "" for c in r if c.choices)
                m = r.choices[0]
                lp = ([(t.token, round(t.logprob, 4)) for t in m.logprobs.content]
                      if m.logprobs else None)
                calls = ([(c.function.name, c.function.arguments) for c in m.message.tool_calls]
                         if m.message.tool_calls else None)
                return m.message.content, lp, calls, m.finish_reason
            return run

        def completion(i, **kw):
            return lambda: self.oai.completions.create(
                model=MODEL, prompt=f"Item {i}: the", **kw).choices[0].text

        def claude(i):
            return lambda: self.claude.messages.create(
                model=MODEL, max_tokens=MAX, messages=chat(f"Name a river, {i}.")).content[0].text

        with open(os.path.join(LORA, "reference.json")) as f:
            lora = json.load(f)

        def tuned(stream):
            def run():
                r = self.oai.completions.create(
                    model=MODEL, prompt=lora["prompt"], max_tokens=lora["max_tokens"],
                    temperature=0, stream=stream, extra_body={"adapter": "tuned"})
                return "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
            return run

        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        tools = [{"type": "function", "function": {
            "name": "lookup", "parameters": {"type": "object",
                                             "properties": {"q": {"type": "string"}}}}}]
        jobs = []
        for i in range(4):
            jobs += [
                oai_chat(i, False, temperature=0) if i < 2 else tuned(i == 3),
                oai_chat(i, True, temperature=0),
                oai_chat(i, False, temperature=0, logprobs=True, top_logprobs=2),
                oai_chat(i, False, temperature=0, stop=[" "]),
                oai_chat(i, False, temperature=0, max_tokens=12, response_format={
                    "type": "json_schema", "json_schema": {"name": "n", "schema": schema}}),
                oai_chat(i, False, temperature=0, tools=tools),  # rendered into the prompt
                oai_chat(i, False, temperature=0.8, seed=100 + i),
                completion(i, max_tokens=MAX, temperature=0, stream=False) if i % 2
                else claude(i),
            ]
        self.assertEqual(len(jobs), 32)
        alone = [job() for job in jobs]
        # The adapter's rows give mlx-lm's text with that adapter (not the base model's).
        self.assertNotEqual(lora["text"], lora["base_text"])
        self.assertEqual([alone[16], alone[24]], [lora["text"]] * 2)
        with ThreadPoolExecutor(32) as pool:
            together = list(pool.map(lambda job: job(), jobs))
        for i, (a, t) in enumerate(zip(alone, together)):
            self.assertEqual(t, a, f"request {i}")

    def test_disconnect_cancels_generation(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=300)
        conn.request("POST", "/v1/completions", json.dumps(
            {"prompt": "Once upon a time", "max_tokens": 4000, "stream": True,
             "ignore_eos": True}), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.fp.readline()
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        # 4000 tokens would take minutes; the next request runs as soon as the engine sees
        # the closed connection.
        t = time.time()
        r = self.oai.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
        self.assertEqual(r.usage.completion_tokens, 1)
        self.assertLess(time.time() - t, 60)

    def test_disconnect_cancels_non_streaming_requests(self):
        # Nothing is written before the end: the server polls the connection between tokens.
        cancelled = lambda: self.server.log_text().count("; cancelled")
        for path, body in (("/v1/completions", {"prompt": "Once upon a time"}),
                           ("/v1/chat/completions", {"messages": chat("Tell a story.")}),
                           ("/v1/messages", {"messages": chat("Tell a story.")})):
            before = cancelled()
            conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=300)
            conn.request("POST", path, json.dumps({**body, "max_tokens": 4000,
                                                   "ignore_eos": True}),
                         {"Content-Type": "application/json"})
            conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()
            # Queued behind the abandoned job: answered once the engine dropped it.
            t = time.time()
            r = self.oai.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
            self.assertEqual(r.usage.completion_tokens, 1)
            self.assertLess(time.time() - t, 60, path)
            # Under load the "Hi" job can reach the engine queue first; the abandoned one is
            # then cancelled at its first token, after this answer.
            deadline = time.time() + 60
            while cancelled() < before + 1 and time.time() < deadline:
                time.sleep(0.2)
            self.assertEqual(cancelled(), before + 1, path)


# A prompt of three Hermes tool calls: the model continues the pattern with a fourth.
TOOL_PROMPT = "".join(
    '<tool_call>{"name": "get_weather", "arguments": {"city": "%s"}}</tool_call>\n' % c
    for c in ("Paris", "Oslo", "Rome"))
# A prompt that ends inside an open <think>: the model closes it and answers.
THINK_PROMPT = "".join("<think>The user asks for a %s.</think>%s\n" % p
                       for p in (("color", "Blue."), ("fruit", "Apple."))) + "<think>"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object",
                                          "properties": {"city": {"type": "string"}}}}}]


class ModelWrittenFormatsTest(unittest.TestCase):
    """Tool calls and reasoning the model itself writes (prompts that make it continue a
    pattern), split by the server, against mlx_lm's greedy output of the same prompt, split by
    mlx_lm's Hermes parser (mlx_lm.tool_parsers.json_tools) and at </think>."""

    @classmethod
    def setUpClass(cls):
        from mlx_lm.tool_parsers import json_tools
        ref = reference()
        text, _ = ref.greedy(ref.tok.encode(TOOL_PROMPT, add_special_tokens=False), 40)
        block = text[:text.index("\n")]
        assert block.startswith("<tool_call>") and block.endswith("</tool_call>"), text
        cls.want = json_tools.parse_tool_call(block[len("<tool_call>"):-len("</tool_call>")])
        text, _ = ref.greedy(ref.tok.encode(THINK_PROMPT, add_special_tokens=False), 24)
        cls.want_reasoning, cls.want_answer = text[:text.index("\n")].split("</think>")
        # One template, two prompts, picked by a chat_template_kwargs entry.
        cls.server = Server("--chat-template",
                            "{% if mode == 'think' %}{% raw %}" + THINK_PROMPT + "{% endraw %}"
                            "{% else %}{% raw %}" + TOOL_PROMPT + "{% endraw %}{% endif %}")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_openai_tool_calls(self):
        client = openai.OpenAI(base_url=self.server.url + "/v1", api_key="none")
        args = dict(model=MODEL, messages=chat("weather?"), tools=TOOLS, max_tokens=40,
                    stop=["\n"], temperature=0)
        r = client.chat.completions.create(**args)
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assertIsNone(r.choices[0].message.content)
        (call,) = r.choices[0].message.tool_calls
        self.assertEqual(call.function.name, self.want["name"])
        self.assertEqual(json.loads(call.function.arguments), self.want["arguments"])
        chunks = list(client.chat.completions.create(**args, stream=True))
        calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        self.assertEqual([(c.index, c.function.name, json.loads(c.function.arguments))
                          for c in calls], [(0, self.want["name"], self.want["arguments"])])
        self.assertEqual(chunks[-1].choices[0].finish_reason, "tool_calls")
        # tool_choice none: no tools in the prompt and no parsing, the text comes back as is.
        r = client.chat.completions.create(**args, tool_choice="none")
        self.assertTrue(r.choices[0].message.content.startswith("<tool_call>"))
        self.assertFalse(r.choices[0].message.tool_calls)

    def test_reasoning_is_split_off(self):
        client = openai.OpenAI(base_url=self.server.url + "/v1", api_key="none")
        args = dict(model=MODEL, messages=chat("dessert?"), max_tokens=24, stop=["\n"],
                    temperature=0, extra_body={"chat_template_kwargs": {"mode": "think"}})
        m = client.chat.completions.create(**args).choices[0].message
        self.assertEqual((m.reasoning_content, m.content), (self.want_reasoning, self.want_answer))
        chunks = list(client.chat.completions.create(**args, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        self.assertEqual("".join(getattr(d, "reasoning_content", None) or "" for d in deltas),
                         self.want_reasoning)
        self.assertEqual("".join(d.content or "" for d in deltas), self.want_answer)
        # A constrained answer closes the open <think> first: the JSON is the content.
        rf = {"type": "json_schema", "json_schema": {"name": "d", "schema": {
            "enum": ["Cake", "Pie"]}}}
        m = client.chat.completions.create(**{**args, "stop": None}, response_format=rf).choices[0]
        self.assertEqual(m.finish_reason, "stop")
        self.assertFalse(getattr(m.message, "reasoning_content", None))
        self.assertIn(json.loads(m.message.content), ["Cake", "Pie"])
        claude = anthropic.Anthropic(base_url=self.server.url, api_key="none")
        msg = claude.messages.create(model=MODEL, max_tokens=24, messages=chat("dessert?"),
                                     stop_sequences=["\n"], extra_body={
                                         "chat_template_kwargs": {"mode": "think"}})
        self.assertEqual([(b.type, getattr(b, "thinking", None) or getattr(b, "text", None))
                          for b in msg.content],
                         [("thinking", self.want_reasoning), ("text", self.want_answer)])

    def test_forced_tool_choice(self):
        # The prompt makes the model call get_weather; a named get_time must win, with
        # arguments valid against its parameters, and required must give a listed tool.
        client = openai.OpenAI(base_url=self.server.url + "/v1", api_key="none")
        time_params = {"type": "object", "properties": {
            "timezone": {"enum": ["UTC", "CET", "PST"]}, "hour24": {"type": "boolean"}},
            "required": ["timezone"]}
        tools = TOOLS + [{"type": "function", "function": {"name": "get_time",
                                                           "parameters": time_params}}]
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        args = dict(model=MODEL, messages=chat("time?"), tools=tools, max_tokens=40,
                    temperature=0)
        named = {"type": "function", "function": {"name": "get_time"}}
        r = client.chat.completions.create(**args, tool_choice=named)
        self.assertEqual(r.choices[0].finish_reason, "tool_calls", r.choices[0].message)
        self.assertIsNone(r.choices[0].message.content)
        (call,) = r.choices[0].message.tool_calls
        self.assertEqual(call.function.name, "get_time")
        jsonschema.validate(json.loads(call.function.arguments), time_params)
        # required, streamed, one call (parallel_tool_calls false): any listed tool.
        chunks = list(client.chat.completions.create(**args, tool_choice="required", stream=True,
                                                     parallel_tool_calls=False))
        calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        self.assertEqual(len(calls), 1)
        self.assertIn(calls[0].function.name, schemas)
        jsonschema.validate(json.loads(calls[0].function.arguments),
                            schemas[calls[0].function.name])
        self.assertEqual(chunks[-1].choices[0].finish_reason, "tool_calls")
        self.assertFalse("".join(c.choices[0].delta.content or "" for c in chunks))
        # Anthropic's {type: tool} maps onto the named function (the same constraint).
        s, m = self.server.request("POST", "/v1/messages", {
            "max_tokens": 40, "messages": chat("time?"), "tool_choice": {"type": "tool", "name": "nope"},
            "tools": [{"name": "get_time", "input_schema": time_params}]})
        self.assertEqual((s, m["type"]), (400, "error"))
        self.assertIn("nope", m["error"]["message"])
        # A parameters schema the constraint cannot enforce: 400 naming the tool and keyword.
        bad = [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}}}]
        with self.assertRaises(openai.BadRequestError) as cm:
            client.chat.completions.create(model=MODEL, messages=chat("x"), tools=bad,
                                           tool_choice="required")
        self.assertEqual(cm.exception.body["param"], "tools[0].function.parameters")
        self.assertIn("unsupported keyword 'minimum'", cm.exception.body["message"])

    def test_anthropic_tool_use(self):
        client = anthropic.Anthropic(base_url=self.server.url, api_key="none")
        args = dict(model=MODEL, max_tokens=40, messages=chat("weather?"), stop_sequences=["\n"],
                    tools=[{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}])
        m = client.messages.create(**args)
        self.assertEqual(m.stop_reason, "tool_use")
        (block,) = [b for b in m.content if b.type == "tool_use"]
        self.assertEqual((block.name, block.input), (self.want["name"], self.want["arguments"]))
        with client.messages.stream(**args) as s:
            final = s.get_final_message()
        (block,) = [b for b in final.content if b.type == "tool_use"]
        self.assertEqual((block.name, block.input), (self.want["name"], self.want["arguments"]))
        self.assertEqual(final.stop_reason, "tool_use")


class EmbeddingsTest(unittest.TestCase):
    """POST /v1/embeddings on a Qwen3-Embedding checkpoint against mlx-lm's vectors: bit-identical
    under --exact, as tests/models/test_embed.cpp asks of the library."""

    @classmethod
    def setUpClass(cls):
        import mlx.core as mx
        with open(os.path.join(EMBED_MODEL, "reference.json")) as f:
            meta = json.load(f)
        cls.texts, cls.ids = meta["texts"], meta["ids"]
        ref = mx.load(os.path.join(EMBED_MODEL, "reference.safetensors"))
        cls.want = [np.array(ref[f"embedding_{i}"]) for i in range(len(cls.texts))]
        cls.server = Server(model=EMBED_MODEL)
        cls.oai = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def assert_vectors(self, got, want):
        self.assertEqual(len(got), len(want))
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g, dtype=np.float32), w)

    def test_texts_and_token_ids_match_mlx_lm(self):
        # The client asks for base64 and decodes it with numpy.
        r = self.oai.embeddings.create(model=EMBED_MODEL, input=self.texts)
        self.assertEqual([d.index for d in r.data], list(range(len(self.texts))))
        self.assert_vectors([d.embedding for d in r.data], self.want)
        self.assertEqual(r.usage.prompt_tokens, sum(len(i) for i in self.ids))
        r = self.oai.embeddings.create(model=EMBED_MODEL, input=self.ids[1:3],
                                       encoding_format="float")
        self.assert_vectors([d.embedding for d in r.data], self.want[1:3])
        s, body = self.server.request("POST", "/v1/embeddings", {"input": self.texts[0]})
        self.assertEqual(s, 200)
        self.assertEqual(body["object"], "list")
        self.assert_vectors([body["data"][0]["embedding"]], self.want[:1])
        s, body = self.server.request("POST", "/v1/embeddings", {"input": self.ids[4]})
        self.assert_vectors([body["data"][0]["embedding"]], self.want[4:])
        dims = len(self.want[0])
        r = self.oai.embeddings.create(model=EMBED_MODEL, input="a", dimensions=dims)
        self.assert_vectors([r.data[0].embedding], self.want[2:3])

    def test_errors(self):
        dims = len(self.want[0])
        for body, param in (({"input": ""}, "input"), ({"input": []}, "input"),
                            ({"input": [[]]}, "input[0]"), ({"input": {"a": 1}}, "input"),
                            ({"input": ["a", 2]}, "input[1]"), ({"input": [1, "a"]}, "input"),
                            ({"input": [10 ** 6]}, "input"), ({}, "input"),
                            ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
                            ({"input": "a", "dimensions": dims // 2}, "dimensions")):
            s, e = self.server.request("POST", "/v1/embeddings", body)
            self.assertEqual((s, e["error"]["param"]), (400, param), (body, e))
        with self.assertRaises(openai.NotFoundError):
            self.oai.embeddings.create(model="text-embedding-3-small", input="a")
        # The checkpoint has no chat template: chat is a clear 400, not a crash.
        s, e = self.server.request("POST", "/v1/chat/completions", {"messages": chat("x")})
        self.assertEqual((s, e["error"]["param"]), (400, "messages"))


class FlagsTest(unittest.TestCase):
    def test_api_key_body_limit_template_flags_and_sigterm(self):
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(MODEL)
        template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{{ cue }}"
        srv = Server("--api-key", "sekrit", "--max-body-bytes", "2000", "--chat-template",
                     template, "--chat-template-args", '{"cue": "Answer:"}')
        try:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekrit")
            for kwargs, cue in ((None, "Answer:"), ({"cue": "Reply in French:"}, "Reply in French:")):
                r = client.chat.completions.create(
                    model=MODEL, messages=chat("hi"), max_tokens=1,
                    extra_body={"chat_template_kwargs": kwargs} if kwargs else None)
                want = tok.encode("<user>hi\n" + cue, add_special_tokens=False)
                self.assertEqual(r.usage.prompt_tokens, len(want), cue)
            body = {"prompt": "Hi", "max_tokens": 1}
            s, e = srv.request("POST", "/v1/completions", body)
            self.assertEqual((s, e["error"]["code"]), (401, "invalid_api_key"))
            s, _ = srv.request("POST", "/v1/completions", body,
                               {"Authorization": "Bearer wrong"})
            self.assertEqual(s, 401)
            for headers in ({"Authorization": "Bearer sekri"}, {"Authorization": "Bearer sekritt"},
                            {"x-api-key": "sekri"}, {"Authorization": "sekrit"}):
                self.assertEqual(srv.request("POST", "/v1/completions", body, headers)[0], 401,
                                 headers)
            s, _ = srv.request("POST", "/v1/completions", body, {"Authorization": "Bearer sekrit"})
            self.assertEqual(s, 200)
            s, _ = srv.request("POST", "/v1/completions", body, {"x-api-key": "sekrit"})
            self.assertEqual(s, 200)
            self.assertEqual(client.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
                             .usage.completion_tokens, 1)
            s, e = srv.request("POST", "/v1/completions", {"prompt": "x" * 5000},
                               {"Authorization": "Bearer sekrit"})
            self.assertEqual(s, 413)
        finally:
            self.assertEqual(srv.stop(), 0)


    def test_full_queue_answers_429(self):
        srv = Server("--max-batch", "1", "--max-queue", "1")
        try:
            body = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True,
                    "stream": True}
            running = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=300)
            running.request("POST", "/v1/completions", json.dumps(body),
                            {"Content-Type": "application/json"})
            resp = running.getresponse()
            resp.fp.readline()  # the one row is taken
            queued = ThreadPoolExecutor(1).submit(
                srv.request, "POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
            time.sleep(1.0)  # the second request waits in the queue
            for path, req in (("/v1/completions", {"prompt": "Hi", "max_tokens": 1}),
                              ("/v1/completions", {"prompt": "Hi", "max_tokens": 1,
                                                   "stream": True}),
                              ("/v1/messages", {"max_tokens": 1, "messages": chat("Hi")})):
                conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
                conn.request("POST", path, json.dumps(req), {"Content-Type": "application/json"})
                r = conn.getresponse()
                err = json.loads(r.read())
                self.assertEqual(r.status, 429, path)
                self.assertEqual(r.getheader("Retry-After"), "1")
                self.assertIn("queue", json.dumps(err))
                conn.close()
            # The running request's client goes: the queued one runs.
            running.sock.shutdown(socket.SHUT_RDWR)
            running.close()
            status, out = queued.result(timeout=120)
            self.assertEqual(status, 200, out)
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_loopback_by_default(self):
        def listening(port):
            """The local addresses listening on `port` (/proc/net/tcp and tcp6, state 0A)."""
            found = []
            for table in ("/proc/net/tcp", "/proc/net/tcp6"):
                with open(table) as f:
                    for line in f.readlines()[1:]:
                        local, state = line.split()[1], line.split()[3]
                        addr, hexport = local.rsplit(":", 1)
                        if state == "0A" and int(hexport, 16) == port:
                            found.append(addr)
            return found

        srv = Server()
        try:
            # 127.0.0.1 only (read from the kernel's table: no traffic to any other address).
            self.assertEqual(listening(srv.port), ["0100007F"])
        finally:
            self.assertEqual(srv.stop(), 0)
        srv = Server("--host", "0.0.0.0")
        try:
            self.assertEqual(listening(srv.port), ["00000000"])
        finally:
            self.assertEqual(srv.stop(), 0)

    def test_refused_flags(self):
        for flags, words in ((["--adapter-path", "x"], "LoRA adapter directory does not exist"),
                             (["--chat-template-args", "[1]"], "--chat-template-args"),
                             (["--port", "0"], "--port")):
            r = subprocess.run([BINARY, "serve", "--exact", "--model", MODEL, *flags], capture_output=True,
                               text=True, timeout=120)
            self.assertEqual(r.returncode, 1, flags)
            self.assertIn(words, r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
