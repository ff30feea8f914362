"""Qwen3-Embedding reference embeddings from mlx-lm's qwen3 model on tiny random checkpoints.

scripts/gen_embed_fixtures.py OUT_DIR writes OUT_DIR/<row>/ (config.json, model.safetensors, a
small byte-level BPE tokenizer.json with <|endoftext|>) and OUT_DIR/index.json. For each text the
reference is Qwen3-Embedding's pooling: the tokenizer's ids plus the end-of-text token, the model
body (`model.model(ids)`, whose output is the final norm's), the last position, cast to float32
and divided by its L2 norm (`mx.linalg.norm`). Sequences run one by one (batch 1).
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_tiny_models import QWEN3, q, row, write_model  # noqa: E402

ROWS = [
    row("qwen3_embed_bf16", QWEN3, 0, 0),
    row("qwen3_embed_f32", QWEN3, 0, 0, dtype="float32"),
    row("qwen3_embed_q4", QWEN3, 0, 0, quant=q(4)),
    # Qwen3-Embedding's own checkpoints are saved as Qwen3Model: no "model." prefix.
    row("qwen3_embed_noprefix", QWEN3, 0, 0),
]
NO_PREFIX = {"qwen3_embed_noprefix"}

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? Paris is the capital of France.",
    "Embeddings map text to vectors; similar texts get similar vectors.",
    "def add(a, b):\n    return a + b\n",
    "Ünïcödé and emoji 🦊 are bytes too.",
]
TEXTS = [
    "Hello world",
    "What is the capital of France?",
    "a",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Ünïcödé 🦊",
]
EOT = "<|endoftext|>"


def make_tokenizer(out):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOT}) + "\n")
    return tok


def strip_prefix(out):
    weights = mx.load(str(out / "model.safetensors"))
    weights = {k.removeprefix("model."): v for k, v in weights.items()}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "model.safetensors.index.json").unlink(missing_ok=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    if args.out_dir.exists():
        shutil.rmtree(args.out_dir)
    args.out_dir.mkdir(parents=True)
    index = []
    for r in ROWS:
        out = args.out_dir / r["name"]
        out.mkdir()
        write_model(r, out)
        tok = make_tokenizer(out)
        model, _ = load_model(out)
        eot = tok.token_to_id(EOT)
        ids, arrays = [], {}
        for i, text in enumerate(TEXTS):
            seq = tok.encode(text).ids + [eot]
            h = model.model(mx.array([seq], dtype=mx.int32))[0, -1].astype(mx.float32)
            arrays[f"embedding_{i}"] = h / mx.linalg.norm(h)
            ids.append(seq)
        mx.eval(arrays)
        mx.save_safetensors(str(out / "reference.safetensors"), arrays)
        if r["name"] in NO_PREFIX:
            strip_prefix(out)
        (out / "reference.json").write_text(json.dumps(dict(texts=TEXTS, ids=ids)) + "\n")
        index.append(r["name"])
    (args.out_dir / "index.json").write_text(
        json.dumps(dict(rows=index, mlx=mx.__version__)) + "\n")
    print(f"{len(index)} embedding rows in {args.out_dir}")


if __name__ == "__main__":
    main()
