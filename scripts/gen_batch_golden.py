#!/usr/bin/env python3
"""mlx-lm's batch_generate on the default SmolLM2 model, for tests/models/test_batch.cpp: the
prompts of gen_golden.py plus one, greedy, all submitted at once (mlx-lm's left-padded
BatchKVCache), with the tokens each prompt gives alone (generate_step) beside them.

usage: gen_batch_golden.py MODEL_DIR OUT_DIR [--max-tokens 48]
"""
import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import batch_generate, generate_step

from gen_golden import PROMPTS

EXTRA = "The three primary colors are"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    model, tokenizer = load(args.model)
    eos = set(tokenizer.eos_token_ids)
    prompts = [tokenizer.encode(p) for p in PROMPTS + [EXTRA]]
    batch = batch_generate(model, tokenizer, prompts, max_tokens=args.max_tokens,
                           return_token_ids=True)
    cases = []
    for ids, got in zip(prompts, batch.token_ids):
        got = [int(t) for t in got if int(t) not in eos]
        alone = []
        for tok, _ in generate_step(mx.array(ids), model, max_tokens=args.max_tokens):
            if tok in eos:
                break
            alone.append(int(tok))
        cases.append({"prompt_ids": ids, "batch_tokens": got, "alone_tokens": alone})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "batch_generate.json").write_text(
        json.dumps({"max_tokens": args.max_tokens, "cases": cases}, indent=1) + "\n")
    same = sum(c["batch_tokens"] == c["alone_tokens"] for c in cases)
    print(f"gen_batch_golden: {len(cases)} prompts, batch_generate equals alone for {same}")


if __name__ == "__main__":
    main()
