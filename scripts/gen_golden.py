#!/usr/bin/env python3
"""Golden outputs of mlx-lm on a converted real checkpoint (the default SmolLM2 model).

For each prompt: the prompt ids from mlx-lm's tokenizer, the greedy tokens of mlx-lm's
generate_step (stopping at EOS, at most --max-tokens), and the log-probabilities of the first
steps. tests/golden/ replays the same prompts through lmx and requires identical results.

usage: gen_golden.py MODEL_DIR OUT_DIR [--max-tokens 128] [--device cpu|gpu]
"""
import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "Write a short poem about the sea, with emoji 🌊 and a line in French.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]
LOGPROB_STEPS = 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                    help="where mlx-lm runs: parity holds per backend (default: cpu)")
    args = ap.parse_args()
    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    model, tokenizer = load(args.model)
    eos = set(tokenizer.eos_token_ids)
    cases = []
    arrays = {}
    for i, prompt in enumerate(PROMPTS):
        ids = tokenizer.encode(prompt)
        tokens = []
        for n, (tok, logprobs) in enumerate(
            generate_step(mx.array(ids), model, max_tokens=args.max_tokens)
        ):
            if n < LOGPROB_STEPS:
                arrays[f"case_{i}.logprobs_{n}"] = logprobs
            if tok in eos:
                break
            tokens.append(tok)
        cases.append(
            {
                "prompt": prompt,
                "prompt_ids": ids,
                "tokens": tokens,
                "text": tokenizer.decode(tokens),
                "logprob_steps": min(LOGPROB_STEPS, len(tokens) + 1),
            }
        )
    mx.save_safetensors(str(out / "logprobs.safetensors"), arrays)
    (out / "golden.json").write_text(
        json.dumps(
            {"model": str(Path(args.model).resolve()), "max_tokens": args.max_tokens,
             "eos_token_ids": sorted(eos), "cases": cases},
            ensure_ascii=False,
            indent=1,
        )
    )
    print(f"golden: {len(cases)} cases, {sum(len(c['tokens']) for c in cases)} tokens -> {out}")


if __name__ == "__main__":
    main()
