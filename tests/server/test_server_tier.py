#!/usr/bin/env python3
"""`lmx serve` at the tier users get by default (L3 on the CPU: lmx's SIMD kernels), where the
other server tests run --exact. The gates are the tier gates' (tests/tier_gate.h, docs/cpu.md)
applied to what the server reports: for each generated token, mlx_lm's next-token distribution
with the server's tokens teacher-forced (one forward of prompt + output) against the server's
top-20 logprobs: the KL over those 20 tokens <= 1e-3 nats on average, and the server's greedy
token mlx_lm's argmax except where mlx_lm's top two lie within 0.05 of each other.

    LMX_BINARY=build/lmx LMX_TEST_DATA=build/testdata .venv/bin/python tests/server/test_server_tier.py
"""
import functools
import math
import os
import sys
import unittest

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_server import MODEL, Server, reference  # noqa: E402

MAX_TOKENS = 16
TOP = 20
MAX_MEAN_KL = 1e-3
TIE = 0.05


@functools.lru_cache(maxsize=None)
def ids_by_text():
    """The APIs report each token as its text: the id of each text (SmolLM2's byte-level BPE
    decodes its ids to distinct texts; the few that collide are checked not to occur)."""
    ref = reference()
    by_text, dup = {}, set()
    for i in range(len(ref.tok._tokenizer.get_vocab())):
        t = ref.tok.decode([i])
        if t in by_text:
            dup.add(t)
        by_text.setdefault(t, i)
    for t in dup:
        del by_text[t]
    return by_text


class DefaultTierTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(exact=False)
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def check_against_reference(self, prompt_ids, tokens, tops):
        """tokens: the server's ids; tops: per position {id: logprob} of its top-20."""
        import mlx.core as mx
        ref = reference()
        self.assertEqual(len(tokens), len(tops))
        ids = prompt_ids + tokens
        logits = ref.model(mx.array([ids]))[0].astype(mx.float32)
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        lp = lp[len(prompt_ids) - 1:len(ids) - 1]  # the distributions the tokens came from
        kls = []
        for i, (tok, top) in enumerate(zip(tokens, tops)):
            row = lp[i]
            order = mx.argsort(-row).tolist()
            want = {j: row[j].item() for j in order[:TOP]}
            # KL(p_ref || p_server) over the reference's top 20 that the server also listed.
            shared = [j for j in want if j in top]
            self.assertGreaterEqual(len(shared), TOP - 2, f"position {i}: top-20 sets differ")
            kls.append(sum(math.exp(want[j]) * (want[j] - top[j]) for j in shared))
            if tok != order[0]:
                self.assertLess(want[order[0]] - want[order[1]], TIE,
                                f"position {i}: the server chose {tok}, mlx_lm's argmax is "
                                f"{order[0]} by a margin of {want[order[0]] - want[order[1]]:.3f}")
        mean_kl = sum(kls) / len(kls)
        self.assertLessEqual(mean_kl, MAX_MEAN_KL, f"per-position KL {kls}")
        return mean_kl

    def test_tier_is_the_fast_one(self):
        self.assertIn("(tier L3 ", self.server.log_text())

    def test_chat_logprobs_pass_the_tier_gates(self):
        ref = reference()
        msgs = [{"role": "user", "content": "Write a short poem about the sea."}]
        r = self.client.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=MAX_TOKENS, temperature=0, logprobs=True,
            top_logprobs=TOP, extra_body={"ignore_eos": True})
        content = r.choices[0].logprobs.content
        prompt_ids = ref.prompt_ids(msgs)
        self.assertEqual(r.usage.prompt_tokens, len(prompt_ids))
        by_text = ids_by_text()
        tokens = [by_text[c.token] for c in content]
        tops = [{by_text[t.token]: t.logprob for t in c.top_logprobs if t.token in by_text}
                for c in content]
        self.assertEqual(ref.tok.decode(tokens), r.choices[0].message.content)
        self.check_against_reference(prompt_ids, tokens, tops)

    def test_completion_stream_passes_the_tier_gates(self):
        ref = reference()
        prompt = "The three primary colors are"
        chunks = list(self.client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, logprobs=TOP,
            stream=True, extra_body={"ignore_eos": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        lps = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
        pieces = [t for lp in lps for t in lp.tokens]
        top_maps = [m for lp in lps for m in lp.top_logprobs]
        by_text = ids_by_text()
        tokens = [by_text[p] for p in pieces]
        tops = [{by_text[t]: v for t, v in m.items() if t in by_text} for m in top_maps]
        self.assertEqual("".join(pieces), text)
        prompt_ids = ref.tok.encode(prompt, add_special_tokens=False)
        self.check_against_reference(prompt_ids, tokens, tops)


if __name__ == "__main__":
    unittest.main()
