#!/usr/bin/env python3
"""Writes a random gpt_oss (fixed seed) with MXFP4 experts and 8-bit affine (group 64) other
layers, the layout of the MXFP4-Q8 conversions, for timing the CPU tier L3's MoE path:
hidden 1024, 4 layers of 32 experts of 768, top-4, 16 / 8 heads of 64, SmolLM2's tokenizer
(vocab 49152, padded by bench/gpu/pad_tokenizer.py).

usage: make_gpt_oss_mxfp4.py OUT_DIR TOKENIZER_DIR   (then: lmx bench --model OUT_DIR)
"""
import contextlib
import io
import sys
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models import gpt_oss
from mlx_lm.utils import quantize_model, save_config, save_model

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from pad_tokenizer import pad_tokenizer  # noqa: E402

CONFIG = dict(
    model_type="gpt_oss",
    hidden_size=1024,
    num_hidden_layers=4,
    intermediate_size=768,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=64,
    num_local_experts=32,
    num_experts_per_tok=4,
    sliding_window=128,
    layer_types=["sliding_attention", "full_attention"] * 2,
    rms_norm_eps=1e-5,
    vocab_size=49152,
    rope_theta=150000,
    max_position_embeddings=4096,
    swiglu_limit=7.0,
    attention_bias=True,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
)


def main():
    out, tok = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(0)
    model = gpt_oss.Model(gpt_oss.ModelArgs.from_dict(CONFIG))
    model.update(tree_map(
        lambda v: v.astype(mx.bfloat16) if mx.issubdtype(v.dtype, mx.floating) else v,
        model.parameters()))
    mxfp4 = {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    q8 = {"group_size": 64, "bits": 8, "mode": "affine"}
    with contextlib.redirect_stdout(io.StringIO()):
        model, config = quantize_model(
            model, dict(CONFIG), 64, 8,
            quant_predicate=lambda path, _: mxfp4 if ".mlp.experts." in path else q8)
    mx.eval(model.parameters())
    save_model(out, model)
    save_config(config, out / "config.json")
    pad_tokenizer(tok, out, CONFIG["vocab_size"])


if __name__ == "__main__":
    main()
