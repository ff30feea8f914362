#!/usr/bin/env python3
"""lmx's DPO / ORPO losses (the definitions of scripts/gen_pref_fixtures.py, which lmx equals bit
for bit) against the loss functions of the PyPI package mlx-lm-lora, on the same model, adapter
and batches. Not part of the test suite: mlx-lm-lora is not a pinned requirement (it pulls
`datasets`); unpack its wheel and put it on PYTHONPATH:

    pip download --no-deps mlx-lm-lora -d /tmp/mll && (cd /tmp/mll && unzip -q *.whl)
    PYTHONPATH=/tmp/mll python scripts/compare_mlx_lm_lora.py build/testdata/pref

For the rows dpo_lora and orpo_lora (fixtures of gen_pref_fixtures.py) the policy is the tiny
llama with the reference's trained adapter; every training batch is scored both ways. Prints
the largest relative difference of the loss and of the reward margin per row.

Where mlx-lm-lora's options differ: it scores chosen and rejected answers in two forwards (lmx:
one of 2B rows), its log_sigmoid is mx.compile'd, its ORPO clips token log-probabilities to
[-1000, 0], applies nan_to_num and multiplies the chosen log-probability by a per-row
`preference_score` (1 here), and calls ORPO's lambda `beta`; its DPO also offers hinge, ipo and
dpop losses and a `delta` (lmx: the sigmoid loss only).
"""

import argparse
import sys
import types
from pathlib import Path

import json

import mlx.core as mx
import numpy as np
from mlx_lm.tuner.utils import linear_to_lora_layers
from mlx_lm.utils import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_pref_fixtures as ref  # noqa: E402

from mlx_lm_lora.trainer.dpo_trainer import compute_score, dpo_loss, get_token_scores  # noqa: E402
from mlx_lm_lora.trainer.orpo_trainer import get_logps, orpo_loss  # noqa: E402


def masks_of(tokens, lengths):
    """mlx-lm-lora's per-token masks: 1 on the answer tokens [offset, length)."""
    pos = mx.arange(tokens.shape[1])
    return mx.logical_and(pos >= lengths[:, 0:1], pos < lengths[:, 1:]).astype(mx.float32)


def compare(dir_):
    r = json.loads((dir_ / "reference.json").read_text())
    a = types.SimpleNamespace(**r["args"])
    model, tokenizer = load(str(dir_ / "model"))
    base, _ = load(str(dir_ / "model"))
    model.freeze()
    linear_to_lora_layers(model, a.num_layers, a.lora_parameters)
    model.load_weights(str(dir_ / "adapters.safetensors"), strict=False)
    rows = ref.load_rows(dir_ / "data" / "train.jsonl", tokenizer)
    np.random.seed(a.seed)
    worst_loss = worst_margin = 0.0
    n = 0
    for tokens, lengths in ref.batches(rows, a.batch_size, a.max_seq_length, False):
        B = tokens.shape[0] // 2
        sums, counts = ref.answer_logps(model, tokens, lengths)
        ours_ref = ref.answer_logps(base, tokens, lengths)[0] if a.train_mode == "dpo" else None
        loss, _, margin = ref.preference_loss(a, sums, counts, ours_ref)
        masks = masks_of(tokens, lengths)
        cw, rw, cm, rm = tokens[:B], tokens[B:], masks[:B], masks[B:]
        if a.train_mode == "dpo":
            def score(m, x, k):
                return compute_score(get_token_scores(m, x, k), k, "sigmoid")
            theirs, reward, _, _ = dpo_loss(score(model, cw, cm), score(model, rw, rm),
                                            score(base, cw, cm), score(base, rw, rm), cm, rm,
                                            beta=a.beta, delta=50.0, loss_type="sigmoid")
        else:
            lw, lwm = get_logps(model, cw, cm)
            ll, llm = get_logps(model, rw, rm)
            theirs, reward, _, _ = orpo_loss(lw, lwm, ll, llm, cm, rm, mx.array(1.0),
                                             beta=getattr(a, "lambda"))
        their_margin = reward[0] - reward[1]
        assert np.isfinite(loss.item()) and np.isfinite(theirs.item()), (loss, theirs)
        n += 1
        worst_loss = max(worst_loss, abs((loss - theirs) / theirs).item())
        worst_margin = max(worst_margin, abs((margin - their_margin) / their_margin).item())
    print(f"{dir_.name}: {n} batches (last: loss {loss.item():.6f} vs {theirs.item():.6f}), max "
          f"relative difference loss {worst_loss:.3g}, reward margin {worst_margin:.3g}")
    return worst_loss, worst_margin


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pref_dir", type=Path)
    root = ap.parse_args().pref_dir
    for row in ("dpo_lora", "orpo_lora"):
        compare(root / row)


if __name__ == "__main__":
    main()
