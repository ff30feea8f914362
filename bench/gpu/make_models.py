#!/usr/bin/env python3
"""Random-weight Hugging Face checkpoints in real model shapes, for the GPU benchmark.

Writes OUT/<name>/ with config.json, model-*.safetensors (bf16, HF key names), and a tokenizer
whose vocabulary is padded to the config's vocab_size (bench/gpu/pad_tokenizer.py), so that every
runtime (lmx, mlx-lm, llama.cpp's convert_hf_to_gguf.py) reads the same files. Weights are drawn
with torch on the GPU from a per-tensor seed (N(0, 0.02), norms 1), so the same seed gives the same
checkpoint on any machine with the same torch.

usage: make_models.py OUT --tokenizer DIR [--models qwen3-0.6b,qwen3-4b,...]
"""
import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pad_tokenizer import pad_tokenizer  # noqa: E402

# Shapes from the models' published config.json files.
QWEN3 = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_act="silu",
             head_dim=128, num_key_value_heads=8, rms_norm_eps=1e-6, rope_theta=1000000.0,
             max_position_embeddings=40960, vocab_size=151936, attention_bias=False,
             torch_dtype="bfloat16", bos_token_id=151643, eos_token_id=151645)
MODELS = {
    "qwen3-0.6b": dict(QWEN3, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, tie_word_embeddings=True),
    "qwen3-4b": dict(QWEN3, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, tie_word_embeddings=True),
    "qwen3-8b": dict(QWEN3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, tie_word_embeddings=False),
    # the 32B class of the tensor-parallel benchmark (bench/gpu/tp.sh)
    "qwen3-32b": dict(QWEN3, hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                      num_attention_heads=64, tie_word_embeddings=False),
    "llama-3.1-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama",
                         hidden_act="silu", hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                         rope_scaling=dict(factor=8.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0,
                                           original_max_position_embeddings=8192,
                                           rope_type="llama3"),
                         max_position_embeddings=131072, vocab_size=128256,
                         tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                         torch_dtype="bfloat16", bos_token_id=128000, eos_token_id=128009),
}


def shapes(c):
    h, i, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    nq, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    out = {"model.embed_tokens.weight": (c["vocab_size"], h), "model.norm.weight": (h,)}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (nq * d, h),
            p + "self_attn.k_proj.weight": (nkv * d, h),
            p + "self_attn.v_proj.weight": (nkv * d, h),
            p + "self_attn.o_proj.weight": (h, nq * d),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        })
        if c["model_type"] == "qwen3":
            out[p + "self_attn.q_norm.weight"] = (d,)
            out[p + "self_attn.k_norm.weight"] = (d,)
    if not c["tie_word_embeddings"]:
        out["lm_head.weight"] = (c["vocab_size"], h)
    return out


def tensor(name, shape, seed):
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.bfloat16)
    g = torch.Generator(device="cuda")
    g.manual_seed(seed ^ int(hashlib.sha256(name.encode()).hexdigest()[:12], 16))
    return (torch.randn(shape, generator=g, device="cuda", dtype=torch.float32) * 0.02).to(
        torch.bfloat16).cpu()


def make(name, out, tokenizer, seed, shard_bytes=4 << 30):
    c = MODELS[name]
    d = out / name
    if (d / "model.safetensors.index.json").exists():
        print(f"make_models: {d} exists", flush=True)
        return
    d.mkdir(parents=True, exist_ok=True)
    shard, size, shards, weight_map = {}, 0, [], {}

    def flush():
        nonlocal shard, size
        if shard:
            fname = f"model-{len(shards) + 1:05d}.safetensors"
            save_file(shard, str(d / fname), metadata={"format": "pt"})
            shards.append((fname, list(shard)))
            shard, size = {}, 0

    total = 0
    for k, s in shapes(c).items():
        t = tensor(k, s, seed)
        shard[k] = t
        size += t.numel() * 2
        total += t.numel() * 2
        if size >= shard_bytes:
            flush()
    flush()
    n = len(shards)
    for idx, (fname, keys) in enumerate(shards):
        final = f"model-{idx + 1:05d}-of-{n:05d}.safetensors"
        (d / fname).rename(d / final)
        for k in keys:
            weight_map[k] = final
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (d / "config.json").write_text(json.dumps(c, indent=2))
    pad_tokenizer(tokenizer, d, c["vocab_size"])
    print(f"make_models: {name}: {total / 1e9:.2f} GB in {n} shards", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    for m in a.models.split(","):
        make(m, a.out, a.tokenizer, a.seed)


if __name__ == "__main__":
    main()
