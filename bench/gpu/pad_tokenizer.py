#!/usr/bin/env python3
"""Copies a tokenizer.json + tokenizer_config.json into a model directory, padding the BPE
vocabulary with plain ASCII tokens ("[PAD<id>]", never produced by the merges) up to the
model's vocab_size, so every id a random prompt or a random model can produce decodes.

usage: pad_tokenizer.py SRC_DIR DST_DIR VOCAB_SIZE
"""
import json
import sys
from pathlib import Path


def pad_tokenizer(src: Path, dst: Path, vocab_size: int):
    tok = json.loads((src / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    used = set(vocab.values()) | {t["id"] for t in tok.get("added_tokens", [])}
    if max(used) >= vocab_size:
        raise SystemExit(f"pad_tokenizer: {src} has ids up to {max(used)}, vocab_size {vocab_size}")
    for i in range(vocab_size):
        if i not in used:
            vocab[f"[PAD{i}]"] = i
    (dst / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    (dst / "tokenizer_config.json").write_text((src / "tokenizer_config.json").read_text())


if __name__ == "__main__":
    pad_tokenizer(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
