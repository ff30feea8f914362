#!/usr/bin/env python3
"""Random-weight MLX checkpoints in real model shapes for the families lmx added after the llama
family (issue 24's speed rows), made with mlx-lm's own model classes so that lmx and mlx-lm read
the same files.

Writes OUT/<name>-4bit-g64/ (the layout bench/gpu/run.sh reads as $W/mlx/<name>-4bit-g64):
config.json, model*.safetensors and a byte-level BPE tokenizer with exactly vocab_size ids (so
every id a random prompt or a random model can produce decodes). Weights are MLX's default
initializers under mx.random.seed(0), cast to bfloat16, then quantized as `mlx_lm.convert -q`
does (4-bit, group 64; gpt-oss's experts MXFP4 as OpenAI ships them), one layer at a time so the
float weights of a 30B MoE never sit in memory at once.

usage: family_models.py OUT [--models phi3-mini,gemma2-2b,...] [--tiny]
  --tiny  the same configs shrunk to a few MB (a local check that each family converts and loads)
"""
import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

# Shapes from the models' published config.json files (transformers' defaults for Qwen3.5,
# whose small dense checkpoints' configs are not at hand: labelled "-like").
MODELS = {
    # microsoft/Phi-3-mini-4k-instruct
    "phi3-mini": dict(model_type="phi3", hidden_size=3072, intermediate_size=8192,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                      rms_norm_eps=1e-5, vocab_size=32064, rope_theta=10000.0,
                      max_position_embeddings=4096, original_max_position_embeddings=4096,
                      tie_word_embeddings=False),
    # google/gemma-2-2b-it
    "gemma2-2b": dict(model_type="gemma2", hidden_size=2304, intermediate_size=9216,
                      num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                      head_dim=256, rms_norm_eps=1e-6, vocab_size=256000, rope_theta=10000.0,
                      query_pre_attn_scalar=256, attn_logit_softcapping=50.0,
                      final_logit_softcapping=30.0, sliding_window=4096,
                      hidden_activation="gelu_pytorch_tanh"),
    # allenai/OLMo-2-0425-1B
    "olmo2-1b": dict(model_type="olmo2", hidden_size=2048, intermediate_size=8192,
                     num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
                     rms_norm_eps=1e-6, vocab_size=100352, rope_theta=500000.0,
                     max_position_embeddings=4096, tie_word_embeddings=False),
    # THUDM/GLM-4-9B-0414
    "glm4-9b": dict(model_type="glm4", hidden_size=4096, intermediate_size=13696,
                    num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=2,
                    head_dim=128, partial_rotary_factor=0.5, rms_norm_eps=1e-5,
                    vocab_size=151552, rope_theta=10000.0, attention_bias=True,
                    max_position_embeddings=32768, tie_word_embeddings=False),
    # ibm-granite/granite-3.3-2b-instruct
    "granite-3.3-2b": dict(model_type="granite", hidden_size=2048, intermediate_size=8192,
                           num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=8,
                           rms_norm_eps=1e-5, vocab_size=49159, rope_theta=10000000.0,
                           embedding_multiplier=12.0, attention_multiplier=0.015625,
                           residual_multiplier=0.22, logits_scaling=8.0,
                           max_position_embeddings=131072, attention_bias=False, mlp_bias=False,
                           tie_word_embeddings=True),
    # HuggingFaceTB/SmolLM3-3B
    "smollm3-3b": dict(model_type="smollm3", hidden_size=2048, intermediate_size=11008,
                       num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=4,
                       rms_norm_eps=1e-6, vocab_size=128256, rope_theta=5000000.0,
                       max_position_embeddings=65536, tie_word_embeddings=True,
                       no_rope_layer_interval=4),
    # Qwen/Qwen3-30B-A3B
    "qwen3-moe-30b-a3b": dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144,
                              moe_intermediate_size=768, num_hidden_layers=48,
                              num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                              num_experts=128, num_experts_per_tok=8, decoder_sparse_step=1,
                              mlp_only_layers=[], norm_topk_prob=True, rms_norm_eps=1e-6,
                              vocab_size=151936, rope_theta=1000000.0,
                              max_position_embeddings=40960, tie_word_embeddings=False),
    # openai/gpt-oss-20b
    "gpt-oss-20b": dict(model_type="gpt_oss", hidden_size=2880, intermediate_size=2880,
                        num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8,
                        head_dim=64, num_local_experts=32, num_experts_per_tok=4,
                        sliding_window=128, rms_norm_eps=1e-5, vocab_size=201088,
                        rope_theta=150000,
                        rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0,
                                          beta_slow=1.0, truncate=False,
                                          original_max_position_embeddings=4096),
                        layer_types=["sliding_attention", "full_attention"] * 12,
                        swiglu_limit=7.0, max_position_embeddings=131072,
                        tie_word_embeddings=False),
    # transformers' Qwen3_5TextConfig defaults (a 9B-class hybrid: 3 gated-DeltaNet layers to 1
    # softmax-attention layer)
    "qwen3.5-9b-like": dict(model_type="qwen3_5", text_config=dict(
        model_type="qwen3_5_text", hidden_size=4096, intermediate_size=12288,
        num_hidden_layers=32, num_attention_heads=16, num_key_value_heads=4, head_dim=256,
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_num_key_heads=16, linear_num_value_heads=32, full_attention_interval=4,
        rms_norm_eps=1e-6, vocab_size=248320, max_position_embeddings=32768,
        tie_word_embeddings=False, rope_parameters=dict(rope_type="default",
                                                        rope_theta=10000000.0,
                                                        partial_rotary_factor=0.25))),
}

TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, moe_intermediate_size=64, num_experts=4,
            num_local_experts=4, num_experts_per_tok=2, vocab_size=1000, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
            query_pre_attn_scalar=32, sliding_window=16)


def shrink(c):
    c = json.loads(json.dumps(c))
    inner = c.get("text_config", c)
    for k, v in TINY.items():
        if k in inner:
            inner[k] = v
    if c["model_type"] == "phi3" or c["model_type"] == "olmo2":
        inner["num_key_value_heads"] = inner["num_attention_heads"]
    if "layer_types" in inner:
        inner["layer_types"] = inner["layer_types"][: inner["num_hidden_layers"]]
    return c


def bytes_to_unicode():
    # GPT-2's byte-level alphabet: printable bytes map to themselves, the rest to 256 + n.
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def write_tokenizer(dst: Path, vocab_size: int):
    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    eos = vocab_size - 1
    for i in range(256, vocab_size - 1):
        vocab[f"[PAD{i}]"] = i
    vocab["<|eos|>"] = eos
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": eos, "content": "<|eos|>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    (dst / "tokenizer.json").write_text(json.dumps(tok))
    (dst / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|eos|>",
         "model_max_length": 131072}))


def make(name: str, config: dict, out: Path):
    dst = out / f"{name}-4bit-g64"
    if (dst / "config.json").exists():
        print(f"{name}: exists", flush=True)
        return
    mx.random.seed(0)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(mx.bfloat16)
    base = getattr(model, "quant_predicate", None)

    def predicate(path, module):
        keep = base(path, module) if base is not None else True
        if keep and config["model_type"] == "gpt_oss" and "experts" in path:
            return {"group_size": 32, "bits": 4, "mode": "mxfp4"}
        return keep

    model, qconfig = quantize_model(model, config, 64, 4, quant_predicate=predicate)
    # One layer at a time: each layer's random float weights are made, quantized and freed.
    inner = model.language_model if hasattr(model, "language_model") else model
    for layer in inner.layers:
        mx.eval(layer.parameters())
    mx.eval(model.parameters())
    dst.mkdir(parents=True, exist_ok=True)
    save_model(dst, model, donate_model=True)
    save_config(qconfig, dst / "config.json")
    vocab = config.get("text_config", config)["vocab_size"]
    write_tokenizer(dst, vocab)
    n = sum(f.stat().st_size for f in dst.glob("*.safetensors"))
    print(f"{name}: {n / 1e9:.2f} GB -> {dst}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    for name in a.models.split(","):
        if name not in MODELS:
            sys.exit(f"family_models: unknown model '{name}', expected one of {', '.join(MODELS)}")
        config = shrink(MODELS[name]) if a.tiny else MODELS[name]
        make(name, config, a.out)


if __name__ == "__main__":
    main()
