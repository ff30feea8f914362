#!/usr/bin/env python3
"""Families' chat-template formats end to end (issue 24): `lmx serve` on the default model with
reduced stand-ins of Qwen3.5's and gpt-oss's chat templates (tests/server/qwen35_reduced.jinja,
harmony_reduced.jinja: the real wire formats, not the real templates, which are not available
offline). A history of tool calls rendered by the template in its own format makes the model
write one more; the server's split of that output (reasoning, content, tool calls on the chat,
Anthropic and Responses endpoints) is checked against the greedy text of the prompt that
transformers renders from the same template and messages, split by mlx_lm's qwen3_coder parser
(Qwen3.5) or at harmony's headers (mlx_lm has no harmony parser). gpt-oss's reasoning effort:
the first token's logprobs under two efforts each match those of that effort's rendered prompt.

The greedy text of a rendered prompt is the same server's raw `/v1/completions` of it (the server
runs --exact, whose greedy text equals mlx_lm's: test_server.py and the golden suites check
that); the chat request after it reuses its KV cache when the two prompts' tokens agree, which
usage.prompt_tokens also checks. So each prompt is prefilled once: mlx's CPU kernels take about
a quarter of a second a token for these 100-570-token prompts.

    LMX_BINARY=build/lmx LMX_TEST_DATA=build/testdata .venv/bin/python tests/server/test_server_formats.py
"""
import json
import os
import re
import sys
import unittest

import anthropic
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import MODEL, Server  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
CITIES = (("Paris", 3), ("Oslo", 5), ("Rome", 2))
QUESTION = "Weather in Berlin for 6 days?"


def history(thinking, turns):
    """`turns` turns of a user question, the assistant's tool call (with its reasoning when
    `thinking`) and the tool's answer, then the question the model answers. The fewest turns after
    which the model writes the call in the template's format: 3 for Qwen3.5, 2 for harmony."""
    msgs = []
    for i, (city, days) in enumerate(CITIES[:turns]):
        call = {"role": "assistant", "content": "", "tool_calls": [{
            "id": "c%d" % i, "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": city, "days": days}}}]}
        if thinking:
            call["reasoning_content"] = "Weather in %s." % city
        msgs += [{"role": "user", "content": "Weather in %s for %d days?" % (city, days)}, call,
                 {"role": "tool", "tool_call_id": "c%d" % i, "name": "get_weather",
                  "content": "sunny"}]
    return msgs + [{"role": "user", "content": QUESTION}]


def wire(msgs):
    """The messages as a client sends them: tool-call arguments as a JSON string."""
    out = json.loads(json.dumps(msgs))
    for m in out:
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.dumps(c["function"]["arguments"])
    return out


def render(template, msgs, tools=TOOLS, **kwargs):
    """The prompt transformers renders from the template."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(MODEL)
    return tok.apply_chat_template(msgs, tools=tools, chat_template=template,
                                   add_generation_prompt=True, tokenize=False, **kwargs)


def raw_greedy(client, prompt, max_tokens, **kwargs):
    """The server's greedy completion of a raw prompt: (text, prompt tokens)."""
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                  temperature=0, **kwargs)
    return r.choices[0].text, r.usage.prompt_tokens


class Qwen35Test(unittest.TestCase):
    """Qwen3.5: the generation prompt opens <think>; the model closes it and writes an XML tool
    call whose `days` the tool's schema types as an integer."""

    MAX = 60

    @classmethod
    def setUpClass(cls):
        from mlx_lm.tool_parsers import qwen3_coder
        path = os.path.join(HERE, "qwen35_reduced.jinja")
        with open(path) as f:
            template = f.read()
        cls.msgs = history(thinking=True, turns=3)
        prompt = render(template, cls.msgs)
        assert prompt.endswith("<|im_start|>assistant\n<think>\n"), prompt[-40:]
        cls.server = Server("--chat-template", path)
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none")
        text, cls.prompt_tokens = raw_greedy(cls.client, prompt, cls.MAX)
        cls.want_reasoning, rest = text.split("</think>", 1)
        blocks = re.findall(r"<tool_call>(.*?)</tool_call>", rest, re.DOTALL)
        assert blocks, text
        cls.want_calls = [qwen3_coder.parse_tool_call(b, TOOLS) for b in blocks]
        assert cls.want_calls[0]["arguments"] == {"city": "Berlin", "days": 6}, text
        cls.want_content = re.sub(r"<tool_call>.*?</tool_call>", "", rest, flags=re.DOTALL)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_format_is_detected(self):
        self.assertIn("tool format qwen3_coder", self.server.log_text())

    def test_chat_tool_calls_and_reasoning(self):
        args = dict(model=MODEL, messages=wire(self.msgs), tools=TOOLS, max_tokens=self.MAX,
                    temperature=0)
        want = [(c["name"], c["arguments"]) for c in self.want_calls]
        r = self.client.chat.completions.create(**args)
        m = r.choices[0].message
        self.assertEqual(r.usage.prompt_tokens, self.prompt_tokens)
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assertEqual(m.reasoning_content, self.want_reasoning)
        self.assertEqual(m.content, self.want_content)
        self.assertEqual([(c.function.name, json.loads(c.function.arguments))
                          for c in m.tool_calls], want)
        chunks = list(self.client.chat.completions.create(**args, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        self.assertEqual("".join(getattr(d, "reasoning_content", None) or "" for d in deltas),
                         self.want_reasoning)
        self.assertEqual("".join(d.content or "" for d in deltas), self.want_content)
        calls = [tc for d in deltas for tc in (d.tool_calls or [])]
        self.assertEqual([(c.function.name, json.loads(c.function.arguments)) for c in calls],
                         want)
        self.assertEqual([c.index for c in calls], list(range(len(want))))
        self.assertEqual(chunks[-1].choices[0].finish_reason, "tool_calls")


class HarmonyTest(unittest.TestCase):
    """gpt-oss: after the generation prompt's `<|start|>assistant` the model addresses the
    function in the role header (` to=functions.get_weather<|channel|>commentary json<|message|>`,
    the order the template writes its history in). <|call|> ends a real gpt-oss generation (an
    EOS token of its generation_config.json); here, where it is plain text, a stop string does."""

    MAX = 40
    STOP = ["<|call|>"]
    HEADER = re.compile(r"^ to=functions\.(\w+)<\|channel\|>commentary json<\|message\|>(.*)$",
                        re.DOTALL)

    @classmethod
    def setUpClass(cls):
        path = os.path.join(HERE, "harmony_reduced.jinja")
        with open(path) as f:
            cls.template = f.read()
        cls.msgs = history(thinking=False, turns=2)
        cls.server = Server("--chat-template", path)
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none")
        text, cls.prompt_tokens = raw_greedy(cls.client, render(cls.template, cls.msgs), cls.MAX,
                                             stop=cls.STOP)
        m = cls.HEADER.match(text)
        assert m, text
        cls.want = (m.group(1), json.loads(m.group(2)))
        assert cls.want == ("get_weather", {"city": "Berlin", "days": 6}), text

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_format_is_detected(self):
        self.assertIn("tool format harmony", self.server.log_text())

    def test_chat_tool_call(self):
        args = dict(model=MODEL, messages=wire(self.msgs), tools=TOOLS, max_tokens=self.MAX,
                    temperature=0, stop=self.STOP)
        r = self.client.chat.completions.create(**args)
        self.assertEqual(r.usage.prompt_tokens, self.prompt_tokens)
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assertIsNone(r.choices[0].message.content)
        (call,) = r.choices[0].message.tool_calls
        self.assertEqual((call.function.name, json.loads(call.function.arguments)), self.want)
        chunks = list(self.client.chat.completions.create(**args, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        self.assertEqual("".join(d.content or "" for d in deltas), "")
        calls = [tc for d in deltas for tc in (d.tool_calls or [])]
        self.assertEqual([(c.index, c.function.name, json.loads(c.function.arguments))
                          for c in calls], [(0, *self.want)])
        self.assertEqual(chunks[-1].choices[0].finish_reason, "tool_calls")
        # tool_choice none: no tools, no parsing; the header comes back as text.
        r = self.client.chat.completions.create(**args, tool_choice="none")
        self.assertFalse(r.choices[0].message.tool_calls)

    def test_anthropic_tool_use_and_responses_function_call(self):
        # The same conversation in each API's own form renders the same prompt.
        a_msgs, items = [], []
        for m in self.msgs:
            if m["role"] == "user":
                a_msgs.append({"role": "user", "content": m["content"]})
                items.append({"role": "user", "content": m["content"]})
            elif m["role"] == "assistant":
                c = m["tool_calls"][0]
                a_msgs.append({"role": "assistant", "content": [
                    {"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                     "input": c["function"]["arguments"]}]})
                items.append({"type": "function_call", "call_id": c["id"],
                              "name": c["function"]["name"],
                              "arguments": json.dumps(c["function"]["arguments"])})
            else:
                a_msgs.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": m["tool_call_id"],
                     "content": m["content"]}]})
                items.append({"type": "function_call_output", "call_id": m["tool_call_id"],
                              "output": m["content"]})
        claude = anthropic.Anthropic(base_url=self.server.url, api_key="none")
        msg = claude.messages.create(
            model=MODEL, max_tokens=self.MAX, messages=a_msgs, stop_sequences=self.STOP,
            tools=[{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}])
        self.assertEqual(msg.stop_reason, "tool_use")
        self.assertEqual([(b.name, b.input) for b in msg.content if b.type == "tool_use"],
                         [self.want])
        r = self.client.responses.create(
            model=MODEL, input=items, tools=[{"type": "function", **TOOLS[0]["function"]}],
            max_output_tokens=self.MAX, temperature=0, extra_body={"stop": self.STOP})
        self.assertEqual([(o.name, json.loads(o.arguments)) for o in r.output
                          if o.type == "function_call"], [self.want])

    def test_reasoning_effort_reaches_the_template(self):
        # One question without tools: the effort sits in the system message either way.
        msgs = [{"role": "user", "content": QUESTION}]
        first = {}
        for effort in ("low", "high"):
            prompt = render(self.template, msgs, tools=None, reasoning_effort=effort)
            self.assertIn("Reasoning: " + effort + "\n", prompt)
            c = self.client.completions.create(model=MODEL, prompt=prompt, max_tokens=1,
                                               temperature=0, logprobs=3)
            want = sorted(c.choices[0].logprobs.top_logprobs[0].items(), key=lambda kv: -kv[1])
            r = self.client.chat.completions.create(
                model=MODEL, messages=msgs, max_tokens=1, temperature=0, logprobs=True,
                top_logprobs=3, extra_body={"reasoning_effort": effort})
            self.assertEqual(r.usage.prompt_tokens, c.usage.prompt_tokens)
            got = r.choices[0].logprobs.content[0].top_logprobs
            self.assertEqual([t.token for t in got], [t for t, _ in want])
            for t, (_, lp) in zip(got, want):
                self.assertAlmostEqual(t.logprob, lp, places=5)
            first[effort] = [t.logprob for t in got]
        # The two efforts' prompts differ where it shows: in the model's next-token logprobs.
        self.assertGreater(max(abs(a - b) for a, b in zip(first["low"], first["high"])), 1e-3)

if __name__ == "__main__":
    unittest.main()
