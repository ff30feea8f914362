#!/usr/bin/env python3
"""References for `lmx lora --train` and `lmx fuse`, made with the real mlx_lm.lora / mlx_lm.fuse.

    gen_train_fixtures.py OUT_DIR

For every row of ROWS, in OUT_DIR/<row>/:
  model/      a tiny random llama of gen_tiny_models.py (float32, or 4-bit: QLoRA) with the
              trained byte-level BPE tokenizer of gen_tokenizer_fixtures.py and a small chat
              template;
  data/       train / valid / test .jsonl drawn with a fixed seed (text rows, or prompt/completion
              rows with --mask-prompt; a few rows carry an extra key, which changes mlx-lm's
              batch order: it sorts rows by their number of keys);
  adapters/   what mlx_lm.lora's train_model writes (adapter_config.json, adapters.safetensors);
  fused/      mlx_lm.fuse of model/ + adapters/ (re-quantized with each module's spec), and for
              the quantized row fused_dequantized/ (mlx_lm.fuse --dequantize);
  reference.json       the run's arguments (mlx_lm.lora's, as its YAML would give them), every
                       report mlx-lm's training callback got (train loss each step, validation
                       loss at each eval) and the test loss;
  reference.safetensors  the logits of mlx_lm.load(model, adapter_path=adapters) on `tokens`.

The run is mlx_lm.lora.run's sequence (np.random.seed, load, load_dataset, train_model, then
evaluate on the test set) with the callback passed through. Both lmx and mlx-lm start from the
seeded LoRA init (mx.random.seed(seed) before linear_to_lora_layers). OUT_DIR/index.json lists
the rows.
"""

import argparse
import contextlib
import io
import json
import random
import shutil
import sys
import types
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.fuse import main as fuse_main
from mlx_lm.lora import CONFIG_DEFAULTS, train_model
from mlx_lm.tuner.datasets import CacheDataset, load_dataset
from mlx_lm.tuner.trainer import TrainingCallback, evaluate
from mlx_lm.utils import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_tiny_models as tiny  # noqa: E402
from gen_tokenizer_fixtures import make_trained_bytelevel  # noqa: E402

CHAT_TEMPLATE = (
    "{% if tools %}<s>tools: {{ tools | map(attribute='function') | map(attribute='name') "
    "| join(', ') }}</s>\n{% endif %}"
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)

WORDS = ("the of and to in is was for on that with as by at from this have are be or an "
         "tokenizer token merge vocabulary byte pair encoding model language text hello world "
         "quick brown fox jumps over lazy dog code def return if else while print").split()

# The tiny llama with room for the tokenizer's 606 ids.
LLAMA = dict(tiny.LLAMA, vocab_size=640, max_position_embeddings=256)

ROWS = [
    # Float32, text rows, every linear layer of both layers, Adam at a constant rate.
    dict(name="llama_f32_text", quant=None, format="text",
         args=dict(num_layers=2, learning_rate=1e-3, batch_size=4, iters=20, steps_per_report=1,
                   steps_per_eval=5, val_batches=2, save_every=10, test_batches=-1, seed=3)),
    # As llama_f32_text with LoRA dropout: the masks are drawn from mx.random's key in the
    # order the adapters run (gate before up), through mlx-lm's compiled step.
    dict(name="llama_f32_dropout", quant=None, format="text",
         args=dict(num_layers=2, learning_rate=1e-3, batch_size=4, iters=20, steps_per_report=1,
                   steps_per_eval=5, val_batches=2, save_every=10, test_batches=-1, seed=13,
                   lora_parameters=dict(rank=8, dropout=0.1, scale=20.0))),
    # QLoRA: 4-bit base, prompt/completion rows with the prompt masked, q/v of the last layer,
    # AdamW with cosine decay after warmup, 2-step gradient accumulation, truncation at 40.
    dict(name="llama_q4_completions", quant=dict(bits=4, group_size=64), format="completions",
         args=dict(num_layers=1, learning_rate=1e-3, batch_size=2, iters=20, steps_per_report=1,
                   steps_per_eval=10, val_batches=-1, save_every=100, test_batches=3, seed=7,
                   mask_prompt=True, optimizer="adamw", grad_accumulation_steps=2,
                   max_seq_length=40,
                   lr_schedule=dict(name="cosine_decay", warmup=4, warmup_init=1e-5,
                                    arguments=[2e-3, 16, 1e-5]),
                   lora_parameters=dict(rank=4, dropout=0.0, scale=10.0,
                                        keys=["self_attn.q_proj", "self_attn.v_proj"]))),
    # DoRA on the 4-bit base, chat `messages` rows (some with tools) with the prompt masked,
    # Adam with bias correction on a linear schedule.
    dict(name="llama_q4_dora_chat", quant=dict(bits=4, group_size=64), format="chat",
         args=dict(fine_tune_type="dora", num_layers=-1, batch_size=3, iters=20,
                   steps_per_report=1, steps_per_eval=10, val_batches=-1, save_every=100,
                   test_batches=-1, seed=11, mask_prompt=True,
                   optimizer_config=dict(adam=dict(bias_correction=True, betas=[0.8, 0.99])),
                   lr_schedule=dict(name="linear_schedule", arguments=[2e-3, 1e-4, 20]))),
    # Full fine-tune of the last layer (every array of it: linears and norms), float32, text
    # rows, AdamW; the "adapter" is the layer's weights.
    dict(name="llama_f32_full", quant=None, format="text",
         args=dict(fine_tune_type="full", num_layers=1, learning_rate=3e-4, batch_size=4,
                   iters=20, steps_per_report=1, steps_per_eval=5, val_batches=2, save_every=10,
                   test_batches=-1, seed=5, optimizer="adamw")),
]


def sentence(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def write_data(r, out, rng):
    out.mkdir(parents=True)
    for split, n in (("train", 24), ("valid", 6), ("test", 6)):
        rows = []
        for i in range(n):
            if r["format"] == "text":
                row = {"text": sentence(rng, 4, 40)}
            elif r["format"] == "completions":
                row = {"prompt": sentence(rng, 2, 8), "completion": sentence(rng, 2, 25)}
            else:
                turns = [{"role": "system", "content": sentence(rng, 2, 5)}]
                for _ in range(rng.randint(1, 2)):
                    turns.append({"role": "user", "content": sentence(rng, 2, 8)})
                    turns.append({"role": "assistant", "content": sentence(rng, 2, 12)})
                row = {"messages": turns}
                if i % 4 == 2:
                    row["tools"] = [{"type": "function", "function": {
                        "name": "lookup", "description": sentence(rng, 2, 4),
                        "parameters": {"type": "object", "properties": {}}}}]
            if i % 5 == 1:
                row["id"] = f"{split}-{i}"  # more keys: sorted after the others
            rows.append(row)
        with open(out / f"{split}.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


def write_model(r, out):
    quant = None if r["quant"] is None else tiny.q(r["quant"]["bits"], r["quant"]["group_size"])
    tiny_row = tiny.row(r["name"], LLAMA, 1, 1, dtype="float32", quant=quant)
    mx.random.seed(tiny.seed_of(r["name"]))
    tiny.write_model(tiny_row, out)
    tok, _ = make_trained_bytelevel(random.Random(3))
    tok.save(str(out / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
              "add_bos_token": True, "tokenizer_class": "PreTrainedTokenizerFast",
              "chat_template": CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")


class Recorder(TrainingCallback):
    def __init__(self):
        self.reports = []

    def on_train_loss_report(self, info):
        self.reports.append({k: float(v) if k != "iteration" else int(v)
                             for k, v in info.items()})

    def on_val_loss_report(self, info):
        self.reports.append({k: float(v) if k != "iteration" else int(v)
                             for k, v in info.items()})


def fuse(model_dir, adapter_dir, save_path, *extra):
    """mlx_lm.fuse's command line, in this process."""
    argv = sys.argv
    sys.argv = ["mlx_lm.fuse", "--model", str(model_dir), "--adapter-path", str(adapter_dir),
                "--save-path", str(save_path), *extra]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            fuse_main()
    finally:
        sys.argv = argv


def run_row(r, out):
    model_dir, data_dir, adapter_dir = out / "model", out / "data", out / "adapters"
    write_model(r, model_dir)
    write_data(r, data_dir, random.Random(tiny.seed_of(r["name"])))
    # The arguments as mlx_lm.lora.main builds them: the row's over CONFIG_DEFAULTS.
    args = dict(CONFIG_DEFAULTS)
    args.update(train=True, test=True, data=str(data_dir), model=str(model_dir),
                adapter_path=str(adapter_dir))
    args.update(r["args"])
    for k in ("clear_cache_threshold", "report_to", "project_name"):
        args.setdefault(k, CONFIG_DEFAULTS.get(k))
    ns = types.SimpleNamespace(**json.loads(json.dumps(args)))
    rec = Recorder()
    np.random.seed(ns.seed)
    model, tokenizer = load(ns.model)
    train_set, valid_set, test_set = load_dataset(ns, tokenizer)
    with contextlib.redirect_stdout(io.StringIO()):
        train_model(ns, model, train_set, valid_set, rec)
    test_loss = evaluate(model=model, dataset=CacheDataset(test_set), batch_size=ns.batch_size,
                         num_batches=ns.test_batches, max_seq_length=ns.max_seq_length)
    # The saved adapter loaded as mlx_lm.generate would: logits of one sequence.
    tokens = mx.array([tokenizer.encode("the quick brown fox jumps over the lazy dog")])
    m2, _ = load(ns.model, adapter_path=str(adapter_dir))
    logits = m2(tokens).astype(mx.float32)
    mx.save_safetensors(str(out / "reference.safetensors"), {"tokens": tokens, "logits": logits})
    # mlx_lm.fuse into fused/ (the float and quantized layers as it writes them).
    fuse(model_dir, adapter_dir, out / "fused")
    if r["quant"] is not None:
        fuse(model_dir, adapter_dir, out / "fused_dequantized", "--dequantize")
    ref = dict(args={k: v for k, v in args.items() if k not in ("data", "model", "adapter_path")},
               reports=rec.reports, test_loss=float(test_loss))
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    args = ap.parse_args()
    root = args.out_dir
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for r in ROWS:
        run_row(r, root / r["name"])
    (root / "index.json").write_text(json.dumps({"rows": [r["name"] for r in ROWS]}, indent=1))


if __name__ == "__main__":
    main()
