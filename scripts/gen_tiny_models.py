#!/usr/bin/env python3
"""Tiny random MLX models and mlx-lm reference logits for lmx's L1 parity tests.

    gen_tiny_models.py OUT_DIR

For every row of ROWS below this builds the mlx-lm model with random weights, casts and
(optionally) quantizes it the way `mlx_lm.convert` does, saves it as an MLX model directory,
loads that directory back with `mlx_lm.utils.load_model` and replays `mlx_lm.generate.generate_step`
(greedy): the prompt except its last token in chunks of `prefill_step`, evaluating the cache after
each chunk, then the last prompt token alone, then DECODE_STEPS (or the row's `decode`)
single-token steps fed with the previous argmax. Every model call's input ids and full logits are
recorded. Rows with a quantized KV cache quantize it after every call with
kv_reference.maybe_quantize_kv_cache: mlx-lm's maybe_quantize_kv_cache, except that sliding-window
caches become kv_reference.RotatingQuantizedReference (mlx-lm raises there) and per-layer
kv_config entries (written to the row's kv_config.json) apply from the first cached token.

Output, per row, in OUT_DIR/parity/<row>/:
  config.json, model.safetensors (+ index)   the model, as mlx-lm writes it
  reference.safetensors                      call_NNN.tokens (1, L) int32, call_NNN.logits (1, L, V)
  reference.json                             the calls in order, the prompt and the greedy tokens
and OUT_DIR/parity/index.json listing the rows. Everything is deterministic (fixed seeds).
"""

import argparse
import contextlib
import importlib
import io
import json
import shutil
import sys
import time
import zlib
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path, tree_unflatten
import mlx_lm
from mlx_lm.convert import mixed_quant_predicate_builder
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model, quantize_model, save_config, save_model

from kv_reference import maybe_quantize_kv_cache

DECODE_STEPS = 16

DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}

# Base configurations (tiny; every Linear input dim is a multiple of 64 so all group sizes apply).
LLAMA = dict(
    model_type="llama",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=256,
    max_position_embeddings=128,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)
# hidden 128, 8 heads of 16: room for GQA ratios 1..8 and group size 128.
LLAMA_WIDE = dict(LLAMA, hidden_size=128, intermediate_size=256, num_attention_heads=8)
QWEN2 = dict(
    model_type="qwen2",
    hidden_size=64,
    num_hidden_layers=3,
    intermediate_size=192,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    vocab_size=300,
    max_position_embeddings=256,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
)
# MLX's CUDA quantized matmuls (sm90, TMA) need 16-byte aligned global strides, which the tiny
# shapes above do not give (a (64, 1) bf16 scale matrix has 2-byte rows) and which real models
# always have: with inputs of 512 or more, every Linear's bf16 scales (K / group_size per row)
# and outputs are 16-byte aligned for groups 32 and 64 (group 128 needs K >= 1024), so the
# quantized rows below run on CUDA too (scripts/gpu/parity.sh, docs/gpu.md).
A512 = dict(hidden_size=512, intermediate_size=1024, num_attention_heads=8, num_key_value_heads=2,
            vocab_size=512)
# head_dim 32 != hidden/heads = 16.
QWEN3 = dict(
    model_type="qwen3",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-6,
    vocab_size=384,
    max_position_embeddings=256,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
)


# Gemma 3 text: layers 2 and 5 global (pattern 3), the others sliding with a window of 8, far
# below prompt + generation, so the rotating caches wrap in prefill chunks and in decode steps.
# head_dim 32 != hidden / heads, query_pre_attn_scalar 24 != head_dim, linear RoPE scaling on the
# global layers only.
GEMMA3_TEXT = dict(
    model_type="gemma3_text",
    hidden_size=64,
    num_hidden_layers=6,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-6,
    vocab_size=320,
    rope_theta=1000000.0,
    rope_local_base_freq=10000.0,
    query_pre_attn_scalar=24,
    sliding_window=8,
    sliding_window_pattern=3,
    max_position_embeddings=256,
    rope_scaling={"rope_type": "linear", "factor": 2.0},
)
# The multimodal wrapper: text_config nested, tensors under language_model.
GEMMA3 = dict(
    model_type="gemma3",
    vocab_size=320,
    text_config=dict(GEMMA3_TEXT, num_hidden_layers=4, sliding_window_pattern=2, sliding_window=6),
)
# Gemma 4 (E2B-like): layers [s, s, f, s, s, f], the last two sharing the K/V of layers 3 and 2,
# per-layer input embeddings, head_dim 32 on sliding layers and 64 on full ones (proportional
# RoPE over the leading quarter), double-wide MLPs on the shared layers, logit softcap 30.
GEMMA4_TEXT = dict(
    model_type="gemma4_text",
    hidden_size=64,
    num_hidden_layers=6,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=32,
    global_head_dim=64,
    rms_norm_eps=1e-6,
    vocab_size=320,
    vocab_size_per_layer_input=320,
    num_kv_shared_layers=2,
    hidden_size_per_layer_input=16,
    sliding_window=8,
    sliding_window_pattern=3,
    max_position_embeddings=256,
    final_logit_softcapping=30.0,
    tie_word_embeddings=True,
)
# Gemma 4 MoE (26B-A4B-like): router + 2 of 4 experts beside the dense MLP, K = V on full layers,
# no KV sharing, no per-layer inputs.
GEMMA4_MOE = dict(
    GEMMA4_TEXT,
    num_hidden_layers=4,
    num_kv_shared_layers=0,
    hidden_size_per_layer_input=0,
    enable_moe_block=True,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=64,
    attention_k_eq_v=True,
    num_key_value_heads=2,
    num_global_key_value_heads=1,
)
GEMMA4 = dict(model_type="gemma4", vocab_size=320, text_config=dict(GEMMA4_TEXT))
# Legacy MiniCPM scalings: embed x12, residual branches x1.4/sqrt(3), head input / (64 / 16).
MINICPM = dict(
    model_type="minicpm",
    hidden_size=64,
    dim_model_base=16,
    num_hidden_layers=3,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=288,
    scale_depth=1.4,
    scale_emb=12,
    max_position_embeddings=256,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)
STARCODER2 = dict(
    model_type="starcoder2",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    norm_epsilon=1e-5,
    vocab_size=272,
    rope_theta=100000,
    tie_word_embeddings=True,
)

# Phi-3: fused qkv_proj / gate_up_proj, untied. longrope over 64 original positions of 256:
# frequencies times long_factor, inputs times sqrt(1 + ln 4 / ln 64).
PHI3 = dict(
    model_type="phi3",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=256,
    rope_theta=10000.0,
    max_position_embeddings=256,
    original_max_position_embeddings=64,
)
PHI3_LONGROPE = dict(
    type="longrope",
    short_factor=[1.0, 1.1, 1.2, 1.3, 1.5, 1.8, 2.0, 2.5],
    long_factor=[1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
)
# OLMo 2: norms after the sublayers, q/k norms over the whole projection.
OLMO2 = dict(
    model_type="olmo2",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    vocab_size=288,
    max_position_embeddings=256,
    rope_theta=500000.0,
    tie_word_embeddings=False,
)
# Granite: every multiplier away from 1 (attention 0.0625 != head_dim^-0.5 = 0.25).
GRANITE = dict(
    model_type="granite",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=256,
    logits_scaling=4.0,
    attention_multiplier=0.0625,
    embedding_multiplier=12.0,
    residual_multiplier=0.22,
    max_position_embeddings=256,
    attention_bias=False,
    mlp_bias=False,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)
# SmolLM3: llama with NoPE layers (default interval 4: layer 3 runs without RoPE).
SMOLLM3 = dict(LLAMA, model_type="smollm3", num_hidden_layers=4, vocab_size=272)
# Gemma 2: caps low enough (5 on attention scores, 3 on logits) that the soft-capping matters.
GEMMA2 = dict(
    model_type="gemma2",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-6,
    vocab_size=320,
    rope_theta=10000.0,
    query_pre_attn_scalar=24,
    attn_logit_softcapping=5.0,
    final_logit_softcapping=3.0,
)
# Qwen3-MoE: layers 0 and 2 route 2 of 4 experts, layer 1 is dense (mlp_only_layers).
QWEN3_MOE = dict(
    model_type="qwen3_moe",
    hidden_size=64,
    num_hidden_layers=3,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_experts=4,
    num_experts_per_tok=2,
    decoder_sparse_step=1,
    mlp_only_layers=[1],
    moe_intermediate_size=64,
    norm_topk_prob=True,
    rms_norm_eps=1e-6,
    vocab_size=320,
    max_position_embeddings=256,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
)
# GLM-4: sandwich norms, fused gate_up_proj, q/k/v biases, traditional RoPE over half the head.
GLM4 = dict(
    model_type="glm4",
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    attention_bias=True,
    partial_rotary_factor=0.5,
    rms_norm_eps=1e-5,
    vocab_size=272,
    rope_theta=10000.0,
    max_position_embeddings=256,
)
# gpt-oss: layers [s, f, s, f] (window 8 < the 30-token prompts, so the rings wrap), attention
# sinks, 2 of 4 biased experts with the clamped SwiGLU, YaRN as the released models configure it.
GPT_OSS = dict(
    model_type="gpt_oss",
    hidden_size=64,
    num_hidden_layers=4,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=8,
    layer_types=["sliding_attention", "full_attention"] * 2,
    rms_norm_eps=1e-5,
    vocab_size=320,
    rope_theta=150000,
    rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                  "truncate": False, "original_max_position_embeddings": 64},
    max_position_embeddings=512,
    swiglu_limit=7.0,
    attention_bias=True,
    tie_word_embeddings=False,
)

# Qwen3-Next: layers 0-2 gated DeltaNet (2 key heads of 32, 4 value heads of 16, conv kernel 4),
# layer 3 gated softmax attention with RoPE over a quarter of head_dim 32; MoE (2 of 4 experts and
# a gated shared expert) on layers 0, 2 and 3, layer 1 dense (mlp_only_layers).
QWEN3_NEXT = dict(
    model_type="qwen3_next",
    hidden_size=64,
    num_hidden_layers=4,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=32,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    num_experts=4,
    num_experts_per_tok=2,
    decoder_sparse_step=1,
    shared_expert_intermediate_size=64,
    mlp_only_layers=[1],
    moe_intermediate_size=64,
    norm_topk_prob=True,
    rms_norm_eps=1e-6,
    vocab_size=320,
    rope_theta=1000000.0,
    partial_rotary_factor=0.25,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    full_attention_interval=4,
)

# Qwen3.5: the multimodal wrapper's text model (text_config; tensors under language_model.), the
# qwen3_next hybrid with separate in_proj_qkv / z / b / a, RoPE from rope_parameters (a third of
# head_dim 24 -> 8 dims), A_log kept in float32 by its cast_predicate; 3 value heads per key head.
QWEN3_5_TEXT = dict(
    hidden_size=64,
    num_hidden_layers=4,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=24,
    linear_num_value_heads=6,
    linear_num_key_heads=2,
    linear_key_head_dim=32,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=3,
    rms_norm_eps=1e-6,
    vocab_size=288,
    max_position_embeddings=512,
    tie_word_embeddings=True,
    full_attention_interval=2,
    rope_parameters=dict(rope_type="default", mrope_section=[2, 1, 1], rope_theta=10000000,
                         partial_rotary_factor=0.34),
)
QWEN3_5 = dict(model_type="qwen3_5", vocab_size=288, text_config=QWEN3_5_TEXT)
# Qwen3.5 MoE: 2 of 4 experts and a gated shared expert on every layer, untied head.
QWEN3_5_MOE = dict(
    model_type="qwen3_5_moe",
    vocab_size=288,
    text_config=dict(QWEN3_5_TEXT, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                     shared_expert_intermediate_size=64, tie_word_embeddings=False),
)


def row(
    name,
    config,
    prompt_len,
    prefill_step,
    dtype="bfloat16",
    quant=None,
    kv=None,
    tied_head=False,
    kv_config=None,
    decode=DECODE_STEPS,
    tiers=True,
    hf_experts=False,
    openai_layout=False,
    infer_modes=False,
    **overrides,
):
    """One model + run. quant: None, or dict(bits, group_size[, recipe]). kv: None, or
    dict(bits, group_size, start) for generate_step's kv_bits / kv_group_size /
    quantized_kv_start. tied_head: drop gemma3's lm_head (its sanitize then ties the head).
    kv_config: per-layer KV bits, a list of dict(layer_idx, bits, group_size) saved as the
    model's kv_config.json. decode: greedy steps after the prompt. tiers: whether
    tests/models/test_tiers.cpp gates this row (float32/float16 quantized rows only).
    hf_experts: save float MoE experts one tensor per expert as Hugging Face checkpoints do
    (mlp.experts.<e>.<proj>.weight), so the loaders' sanitize must stack them. openai_layout:
    save gpt-oss's MXFP4 experts as OpenAI's checkpoints hold them (see to_openai_layout).
    infer_modes: drop the quantization block's per-module entries, so that loaders infer each
    module's bits, group size and mode from its tensors (mlx-lm's infer_quant_config)."""
    return dict(
        name=name,
        config=dict(config, **overrides),
        dtype=dtype,
        quant=quant,
        kv=kv,
        tied_head=tied_head,
        kv_config=kv_config,
        decode=decode,
        prompt_len=prompt_len,
        prefill_step=prefill_step,
        tiers=tiers,
        hf_experts=hf_experts,
        openai_layout=openai_layout,
        infer_modes=infer_modes,
    )


def q(bits, group_size=64, recipe=None, mode=None):
    """mode: MLX's quantization mode (None = affine); mlx-lm then applies the model's own
    quant_predicate (gpt-oss keeps its router at 8-bit affine)."""
    return dict(bits=bits, group_size=group_size, recipe=recipe, mode=mode)


def kv(bits, group_size=64, start=0):
    return dict(bits=bits, group_size=group_size, start=start)


def layer_kv(layer, bits, group_size):
    """One kv_config.json entry (mlx-optiq's format)."""
    return dict(layer_idx=layer, bits=bits, group_size=group_size)


ROWS = [
    # --- llama: structure ---
    row("llama_tied", LLAMA, 21, 8),
    row("llama_untied", LLAMA, 13, 2048, tie_word_embeddings=False),
    row("llama_gqa1", LLAMA_WIDE, 17, 8, num_key_value_heads=8),
    row("llama_gqa2", LLAMA_WIDE, 9, 2048, num_key_value_heads=4),
    row("llama_gqa4", LLAMA_WIDE, 30, 8, num_key_value_heads=2),
    row("llama_gqa8", LLAMA_WIDE, 11, 2048, num_key_value_heads=1),
    row("llama_bias", LLAMA, 19, 8, attention_bias=True, mlp_bias=True, tie_word_embeddings=False),
    row("llama_head_dim", LLAMA, 12, 2048, head_dim=32),
    row("llama_rope_traditional", LLAMA, 15, 8, rope_traditional=True),
    # --- llama: RoPE scaling (original context 64 / max 32 so the scaling changes the result) ---
    row(
        "llama_rope_llama3",
        LLAMA,
        40,
        8,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    row("llama_rope_linear", LLAMA, 25, 2048, rope_scaling={"type": "linear", "factor": 4.0}),
    row(
        "llama_rope_yarn",
        LLAMA,
        33,
        8,
        rope_scaling={
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
        },
    ),
    row(
        "llama_rope_dynamic",
        LLAMA,
        29,
        8,
        max_position_embeddings=32,
        rope_scaling={"type": "dynamic", "factor": 2.0},
    ),
    # --- qwen2 / qwen3: structure ---
    row("qwen2_tied", QWEN2, 23, 8),
    row("qwen2_untied", QWEN2, 7, 2048, tie_word_embeddings=False),
    row("qwen3_tied", QWEN3, 27, 8),
    row("qwen3_untied", QWEN3, 10, 2048, tie_word_embeddings=False),
    # --- dtypes ---
    row("llama_f16", LLAMA, 18, 8, dtype="float16", tie_word_embeddings=False),
    row("qwen3_f32", QWEN3, 14, 8, dtype="float32"),
    row("llama_f16_q4_g64", LLAMA, 16, 2048, dtype="float16", quant=q(4)),
    # --- quantization: every arch at 4/g64, 4/g32, 8/g64 ---
    row("llama_q4_g64", LLAMA, 20, 8, quant=q(4)),
    row("llama_q4_g32", LLAMA, 9, 2048, quant=q(4, 32)),
    row("llama_q8_g64", LLAMA, 31, 8, quant=q(8)),
    row("qwen2_q4_g64", QWEN2, 17, 8, quant=q(4), tie_word_embeddings=False),
    row("qwen2_q4_g32", QWEN2, 22, 2048, quant=q(4, 32)),
    row("qwen2_q8_g64", QWEN2, 6, 2048, quant=q(8), tie_word_embeddings=False),
    row("qwen3_q4_g64", QWEN3, 35, 8, quant=q(4)),
    row("qwen3_q4_g32", QWEN3, 8, 2048, quant=q(4, 32), tie_word_embeddings=False),
    row("qwen3_q8_g64", QWEN3, 17, 8, quant=q(8)),
    # --- quantization: other bit widths and group size 128 (llama) ---
    row("llama_q2_g64", LLAMA, 12, 8, quant=q(2)),
    row("llama_q3_g64", LLAMA, 24, 8, quant=q(3), tie_word_embeddings=False),
    row("llama_q5_g64", LLAMA, 5, 2048, quant=q(5)),
    row("llama_q6_g64", LLAMA, 26, 8, quant=q(6), tie_word_embeddings=False),
    row("llama_q4_g128", LLAMA_WIDE, 19, 8, quant=q(4, 128), num_key_value_heads=2),
    # --- quantization: per-module overrides, as mlx-lm writes them into config["quantization"] ---
    # embed_tokens and lm_head at 8 bits, the rest at the 4-bit default.
    row("llama_q4_embed_head_q8", LLAMA, 17, 8, quant=q(4, recipe="embed_head_8"),
        tie_word_embeddings=False),
    # tied: the 8-bit embedding is also the head (QuantizedEmbedding.as_linear).
    row("qwen3_q4_embed_q8", QWEN3, 13, 8, quant=q(4, recipe="embed_head_8")),
    # lm_head left in float (no entry in the config, no .scales): quantized iff .scales exists.
    row("llama_q4_float_head", LLAMA, 15, 2048, quant=q(4, recipe="float_head"),
        tie_word_embeddings=False),
    # mlx-lm's mixed recipes (mlx_lm.convert --quant-predicate).
    row("qwen2_mixed_3_6", QWEN2, 21, 8, quant=q(3, recipe="mixed_3_6"),
        tie_word_embeddings=False),
    row("llama_mixed_2_6", LLAMA_WIDE, 14, 2048, quant=q(2, recipe="mixed_2_6"),
        num_hidden_layers=3, tie_word_embeddings=False),
    # --- float32 quantized models: the tier L3 gates (tests/models/test_tiers.cpp) compare the
    # CPU kernels with L1 here; MLX's CPU quantized matmul accumulates bfloat16 inputs in
    # bfloat16, so on bf16 rows the gate would measure L1's own rounding ---
    row("llama_f32_q4_g64", LLAMA, 20, 8, dtype="float32", quant=q(4)),
    row("llama_f32_q4_g32", LLAMA, 9, 2048, dtype="float32", quant=q(4, 32),
        tie_word_embeddings=False),
    row("qwen3_f32_q8_g64", QWEN3, 17, 8, dtype="float32", quant=q(8)),
    row("qwen2_f32_q3_g64", QWEN2, 12, 8, dtype="float32", quant=q(3)),
    row("llama_f32_mixed_2_6", LLAMA_WIDE, 14, 2048, dtype="float32",
        quant=q(2, recipe="mixed_2_6"), num_hidden_layers=3, tie_word_embeddings=False),
    row("llama_f32_q5_g32", LLAMA, 10, 8, dtype="float32", quant=q(5, 32)),
    row("llama_f32_q4_rope_traditional", LLAMA, 15, 8, dtype="float32", quant=q(4),
        rope_traditional=True),
    row("gemma3_text_f32_q4_g64", GEMMA3_TEXT, 30, 8, dtype="float32", quant=q(4),
        tied_head=True),
    row("starcoder2_f32_q6_g64", STARCODER2, 16, 2048, dtype="float32", quant=q(6),
        tie_word_embeddings=False),
    row("phi3_f32_q4_g64", PHI3, 19, 8, dtype="float32", quant=q(4), rope_scaling=PHI3_LONGROPE),
    row("gemma2_f32_q8_g64", GEMMA2, 16, 2048, dtype="float32", quant=q(8)),
    row("qwen3_moe_f32_q4_g32", QWEN3_MOE, 41, 8, dtype="float32", quant=q(4, 32)),
    row("olmo2_f32_q4_g64", OLMO2, 23, 8, dtype="float32", quant=q(4)),
    row("granite_f32_q4_g64", GRANITE, 22, 2048, dtype="float32", quant=q(4),
        tie_word_embeddings=False),
    row("glm4_f32_q4_g64", GLM4, 24, 8, dtype="float32", quant=q(4)),
    row("smollm3_f32_q4_g32", SMOLLM3, 25, 8, dtype="float32", quant=q(4, 32)),
    row("gpt_oss_f32_q4_g64", GPT_OSS, 30, 8, dtype="float32", quant=q(4)),
    # MXFP4 experts, the rest float (OpenAI's checkpoints), and MXFP4 everywhere but the router
    # (mlx_lm.convert --q-mode mxfp4): L3 widens them to 8-bit affine at load (kernels/cpu/qmm.h
    # widen_mxfp4). The second row's random logits hold near-ties (L1's top two 4.5e-5 and 5.8e-5
    # apart where L3's greedy run leaves it on 2 of 4 prompts), so it has the teacher-forced gates
    # and the graph test of test_tiers.cpp's TiersMxfp4, not the greedy one.
    row("gpt_oss_f32_mxfp4_experts", GPT_OSS, 30, 8, dtype="float32",
        quant=q(4, 32, recipe="experts_only", mode="mxfp4")),
    row("gpt_oss_f32_mxfp4", GPT_OSS, 30, 8, dtype="float32", quant=q(4, 32, mode="mxfp4"),
        tiers=False),
    row("qwen3_5_f32_q4_g64", QWEN3_5, 25, 8, dtype="float32", quant=q(4)),
    row("qwen3_5_moe_f32_q4_g64", QWEN3_5_MOE, 33, 8, dtype="float32", quant=q(4)),
    row("gemma4_moe_f32_q4_g64", GEMMA4_MOE, 30, 8, dtype="float32", quant=q(4)),
    # --- gemma3_text / gemma3: sliding window 8 with 30-token prompts, so the ring wraps ---
    row("gemma3_text_window8", GEMMA3_TEXT, 30, 8),
    row("gemma3_text_window8_oneshot", GEMMA3_TEXT, 30, 2048, tied_head=True),
    row("gemma3_text_chunk3", GEMMA3_TEXT, 30, 3, tied_head=True),
    row("gemma3_text_f16", GEMMA3_TEXT, 26, 8, dtype="float16", tied_head=True),
    row("gemma3_text_q4_g64", GEMMA3_TEXT, 30, 8, quant=q(4), tied_head=True),
    row("gemma3_tied", GEMMA3, 24, 8, tied_head=True),
    row("gemma3_untied_q4_g32", GEMMA3, 21, 2048, quant=q(4, 32)),
    # --- gemma4_text / gemma4: KV sharing, per-layer inputs, MoE (sorted when L * k >= 64) ---
    row("gemma4_text_ple", GEMMA4_TEXT, 30, 8),
    row("gemma4_text_ple_oneshot", GEMMA4_TEXT, 30, 2048),
    row("gemma4_text_q4_g64", GEMMA4_TEXT, 27, 8, quant=q(4), tie_word_embeddings=False),
    # (float experts in f32: MLX's CPU gather_mm supports nothing else; quantized ones in bf16)
    row("gemma4_moe_f32", GEMMA4_MOE, 30, 8, dtype="float32"),
    row("gemma4_moe_sorted_f32", GEMMA4_MOE, 41, 2048, dtype="float32"),
    row("gemma4_moe_q4_g64", GEMMA4_MOE, 41, 2048, quant=q(4)),
    row("gemma4_wrapper", GEMMA4, 22, 8),
    # --- minicpm (untied: mlx-lm's sanitize breaks tied checkpoints) / starcoder2 ---
    row("minicpm", MINICPM, 25, 8),
    row("minicpm_q4_g64", MINICPM, 19, 2048, quant=q(4)),
    row("starcoder2_tied", STARCODER2, 23, 8),
    row("starcoder2_untied_q4_g64", STARCODER2, 16, 2048, quant=q(4), tie_word_embeddings=False),
    # --- phi3: longrope (full rotation), partial rotary 4-bit ---
    row("phi3_longrope", PHI3, 21, 8, rope_scaling=PHI3_LONGROPE),
    row("phi3_partial_q4_g64", PHI3, 17, 2048, quant=q(4), partial_rotary_factor=0.5),
    # --- olmo2 ---
    row("olmo2", OLMO2, 23, 8),
    row("olmo2_q4_g64", OLMO2, 17, 2048, quant=q(4), tie_word_embeddings=True),
    # --- granite (its quant_predicate keeps o_proj, down_proj and lm_head at 8 bits) ---
    row("granite", GRANITE, 22, 8),
    row("granite_q4_g64", GRANITE, 15, 2048, quant=q(4), tie_word_embeddings=False),
    # --- smollm3: NoPE layers by interval, then by list ---
    row("smollm3", SMOLLM3, 25, 8),
    row("smollm3_q4_g64", SMOLLM3, 19, 2048, quant=q(4), no_rope_layers=[1, 0, 1, 0],
        tie_word_embeddings=False),
    # --- llama's layer_types: sliding layers with window 8 < prompt 30 beside full ones ---
    row("llama_layer_types_window8", LLAMA, 30, 8, num_hidden_layers=4, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 2),
    # --- gemma2: soft-capped attention and logits ---
    row("gemma2", GEMMA2, 21, 8),
    row("gemma2_q4_g64", GEMMA2, 17, 2048, quant=q(4), num_key_value_heads=4),
    # --- qwen3_moe (float experts in f32, see gemma4): unsorted (L * k < 64) with per-expert
    # tensors for sanitize to stack, and sorted ---
    row("qwen3_moe_f32", QWEN3_MOE, 30, 8, dtype="float32", hf_experts=True),
    row("qwen3_moe_sorted_q4_g64", QWEN3_MOE, 41, 2048, quant=q(4), norm_topk_prob=False,
        decoder_sparse_step=2, mlp_only_layers=[], tie_word_embeddings=False),
    # --- gpt_oss (float experts in f32, see gemma4): unsorted, then sorted (L * k >= 64);
    # MXFP4 experts (mode "mxfp4", group 32, the router at 8-bit affine); a long greedy run
    # (prefill 200 in chunks of 64 + decode 120 over a window of 16) ---
    row("gpt_oss_f32", GPT_OSS, 30, 8, dtype="float32"),
    row("gpt_oss_sorted_f32", GPT_OSS, 41, 2048, dtype="float32"),
    row("gpt_oss_mxfp4", GPT_OSS, 30, 8, quant=q(4, 32, mode="mxfp4")),
    row("gpt_oss_sorted_mxfp4", GPT_OSS, 41, 2048, quant=q(4, 32, mode="mxfp4")),
    row("gpt_oss_q4_g64", GPT_OSS, 30, 8, quant=q(4)),
    # the router's 8-bit affine entry dropped from config.json: its mode is inferred (float
    # scales) beside the mxfp4 default
    row("gpt_oss_mxfp4_inferred_router", GPT_OSS, 21, 8, quant=q(4, 32, mode="mxfp4"),
        infer_modes=True),
    # OpenAI's checkpoint layout (gate_up_proj_blocks ...), sanitized at load
    row("gpt_oss_openai_mxfp4", GPT_OSS, 30, 8, quant=q(4, 32, recipe="experts_only",
        mode="mxfp4"), openai_layout=True),
    row("gpt_oss_w16_p200_d120", GPT_OSS, 201, 64, decode=120, dtype="float32", sliding_window=16),
    # --- glm4 ---
    row("glm4", GLM4, 24, 8),
    row("glm4_q4_g64", GLM4, 18, 2048, quant=q(4)),
    # --- qwen3_next: gated DeltaNet + gated attention hybrid (float experts in f32, see gemma4),
    # per-expert tensors (Hugging Face layout: sanitize stacks them and adds 1 to the norms) ---
    row("qwen3_next_f32", QWEN3_NEXT, 30, 8, dtype="float32", hf_experts=True),
    row("qwen3_next_dense", QWEN3_NEXT, 23, 8, num_experts=0, tie_word_embeddings=True),
    row("qwen3_next_q4_g64", QWEN3_NEXT, 41, 2048, quant=q(4), num_hidden_layers=8),
    row("qwen3_next_dense_q8_g64_p100_d100", QWEN3_NEXT, 101, 32, quant=q(8), num_experts=0,
        decode=100),
    row("qwen3_next_kv8_g32", QWEN3_NEXT, 30, 8, num_experts=0, kv=kv(8, 32, 0)),
    # float32 quantized: the tier gates (test_tiers.cpp) on the hybrid's quantized Linears
    row("qwen3_next_f32_q4_g64", QWEN3_NEXT, 20, 8, dtype="float32", quant=q(4)),
    # --- qwen3_5 / qwen3_5_moe (float experts in f32; 4-bit with the 8-bit router of its
    # quant_predicate), the MoE experts also saved as Hugging Face's fused gate_up_proj ---
    row("qwen3_5", QWEN3_5, 25, 8),
    row("qwen3_5_q4_g64", QWEN3_5, 19, 2048, quant=q(4)),
    row("qwen3_5_moe_f32", QWEN3_5_MOE, 30, 8, dtype="float32", hf_experts=True),
    row("qwen3_5_moe_q4_g64", QWEN3_5_MOE, 33, 8, quant=q(4)),
    # --- 16-byte aligned widths (A512): the quantized rows that also run on CUDA ---
    row("llama_a512_q4_g64", LLAMA, 19, 8, quant=q(4), **A512),
    row("llama_a512_q4_g32", LLAMA, 12, 2048, quant=q(4, 32), tie_word_embeddings=False, **A512),
    row("llama_a512_q8_g64", LLAMA, 21, 8, quant=q(8), **A512),
    # Not tier-gated: MLX's CPU float16 quantized matmul is scalar, so L1's side of the gates
    # takes 12 minutes at this width; llama_f16_q4_g64 gates the same kernels at width 64.
    row("llama_a1024_f16_q4_g128", LLAMA, 17, 2048, dtype="float16", quant=q(4, 128),
        tiers=False, **dict(A512, hidden_size=1024, intermediate_size=2048)),
    row("qwen2_a512_q4_g64", QWEN2, 23, 8, quant=q(4), num_hidden_layers=2, **A512),
    row("qwen3_a512_q4_g64", QWEN3, 20, 8, quant=q(4), head_dim=64, **A512),
    row("gemma3_text_a512_q4_g64", GEMMA3_TEXT, 30, 8, quant=q(4), tied_head=True, head_dim=64,
        query_pre_attn_scalar=64, num_hidden_layers=3, **A512),
    # --- quantized KV cache (generate_step kv_bits): prefill 40 + decode 16 ---
    # converted after the first prefill chunk; GQA 2, head_dim 64
    row("llama_kv4_g64", LLAMA, 41, 8, kv=kv(4, 64, 0), head_dim=64),
    # converted mid-prefill (offset 24 >= 20)
    row("llama_kv8_g64_start20", LLAMA, 41, 8, kv=kv(8, 64, 20), head_dim=64),
    # one 40-token chunk, converted during decode (offset 44); group 32
    row("llama_kv4_g32_start44", LLAMA, 41, 2048, kv=kv(4, 32, 44), head_dim=32),
    # no GQA (8 KV heads of 32), 8 bits group 32
    row("llama_kv8_g32_gqa1", LLAMA_WIDE, 41, 8, kv=kv(8, 32, 0), num_key_value_heads=8,
        head_dim=32),
    # 4-bit weights and a 4-bit cache; qwen3's q/k norms before the quantized attention
    row("qwen3_q4_kv4_g32", QWEN3, 41, 8, quant=q(4), kv=kv(4, 32, 0)),
    row("starcoder2_kv8_g32", STARCODER2, 41, 8, kv=kv(8, 32, 0), num_attention_heads=2),
    # --- quantized sliding-window caches (RotatingQuantizedKVCache), window 8 < prompt 30 ---
    # converted after the first prefill chunk: the quantized rings wrap in prefill and decode
    row("gemma3_text_kv4_g32", GEMMA3_TEXT, 30, 8, kv=kv(4, 32, 0), tied_head=True),
    # head_dim 64, converted mid-prefill (offset 24 >= 20), after the rings wrapped
    row("gemma3_text_kv8_g64_start20", GEMMA3_TEXT, 30, 8, kv=kv(8, 64, 20), head_dim=64),
    # one-shot prefill, converted at the last prompt token; 8 bits group 32
    row("gemma3_text_kv8_g32_oneshot", GEMMA3_TEXT, 30, 2048, kv=kv(8, 32, 0), tied_head=True),
    row("gemma3_kv4_g32_wrapper", GEMMA3, 21, 8, kv=kv(4, 32, 0), tied_head=True),
    # gemma4 MoE (no KV sharing: mlx-lm's shared layers have no quantized attention path),
    # sliding head_dim 32 and full head_dim 64, 4-bit weights
    row("gemma4_moe_q4_kv8_g32", GEMMA4_MOE, 30, 8, quant=q(4), kv=kv(8, 32, 0)),
    # --- per-layer KV bits from kv_config.json: sliding layers 0 and 4 and global layer 2 at
    # their own bits, the rest unquantized; then with kv_bits 8 for the unlisted layers ---
    row("gemma3_text_kv_config", GEMMA3_TEXT, 30, 8, tied_head=True,
        kv_config=[layer_kv(0, 4, 32), layer_kv(2, 8, 32), layer_kv(4, 2, 32)]),
    row("gemma3_text_kv_config_kv8", GEMMA3_TEXT, 30, 2048, tied_head=True, kv=kv(8, 32, 24),
        kv_config=[layer_kv(1, 4, 32), layer_kv(5, 6, 32)]),
    row("llama_kv_config", LLAMA, 20, 8, head_dim=64, kv_config=[layer_kv(1, 4, 64)]),
    # --- each cache type over prefill 300 (chunks of 128) + decode 200, window 64 ---
    row("llama_p300_d200", LLAMA, 301, 128, decode=200, max_position_embeddings=512),
    row("llama_kv8_g64_p300_d200", LLAMA, 301, 128, decode=200, kv=kv(8, 64, 0), head_dim=64,
        max_position_embeddings=512),
    row("gemma3_text_w64_p300_d200", GEMMA3_TEXT, 301, 128, decode=200, tied_head=True,
        sliding_window=64, max_position_embeddings=512),
    row("gemma3_text_w64_kv4_g32_p300_d200", GEMMA3_TEXT, 301, 128, decode=200, tied_head=True,
        kv=kv(4, 32, 0), sliding_window=64, max_position_embeddings=512),
]


def seed_of(name):
    return zlib.crc32(name.encode())


def init_weights(model):
    """Re-draws every parameter so activations stay O(1) and attention is not uniform: Linear
    weights N(0, 1/in), embeddings N(0, 0.3^2), norm weights and gemma4's scalars
    1 + N(0, 0.1^2), biases N(0, 0.1^2)."""
    params = []
    for name, p in sorted(tree_flatten(model.parameters())):
        noise = mx.random.normal(p.shape, dtype=mx.float32)
        if name.endswith(".bias"):
            value = 0.1 * noise
        elif "norm" in name.rsplit(".", 2)[-2]:
            value = 1.0 + 0.1 * noise
        elif name.endswith(("layer_scalar", "router.scale", "per_expert_scale")):
            value = 1.0 + 0.1 * noise
        elif "embed_tokens" in name:
            value = 0.3 * noise
        else:
            value = noise * (p.shape[-1] ** -0.5)
        params.append((name, value))
    model.update(tree_unflatten(params))


def quant_predicate(recipe, model, group_size):
    """The `quant_predicate` mlx-lm's quantize_model gets for a row (None = uniform)."""
    if recipe is None:
        return None
    if recipe.startswith("mixed_"):
        return mixed_quant_predicate_builder(recipe, model, group_size)
    if recipe == "embed_head_8":
        high = {"group_size": group_size, "bits": 8, "mode": "affine"}
        return lambda path, _: high if path.endswith(("embed_tokens", "lm_head")) else True
    if recipe == "experts_only":
        return lambda path, _: ".mlp.experts." in path
    if recipe == "float_head":
        return lambda path, _: not path.endswith("lm_head")
    raise ValueError(f"unknown recipe {recipe}")


def write_model(r, out):
    """Builds, casts, quantizes and saves one row's model as mlx-lm's convert would."""
    config = dict(r["config"], torch_dtype=r["dtype"])
    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = arch.Model(arch.ModelArgs.from_dict(config))
    if r["tied_head"]:
        # What gemma3_text.sanitize does for a checkpoint without lm_head.weight.
        text = getattr(model, "language_model", model)
        text.tie_word_embeddings = True
        text.pop("lm_head")
    init_weights(model)
    # mlx_lm.convert's cast: the model's cast_predicate keeps some parameters (qwen3_5's A_log)
    # in their dtype.
    keep = getattr(model, "cast_predicate", lambda _: True)
    dtype = DTYPES[r["dtype"]]
    model.update(tree_map_with_path(
        lambda k, v: v.astype(dtype) if keep(k) and mx.issubdtype(v.dtype, mx.floating) else v,
        model.parameters()))
    if (qt := r["quant"]) is not None:
        pred = quant_predicate(qt["recipe"], model, qt["group_size"])
        with contextlib.redirect_stdout(io.StringIO()):  # quantize_model prints bits per weight
            model, config = quantize_model(
                model, config, qt["group_size"], qt["bits"], mode=qt["mode"] or "affine",
                quant_predicate=pred,
            )
    mx.eval(model.parameters())
    save_model(out, model)
    if r["hf_experts"]:
        unstack_experts(out, fused=config["model_type"] == "qwen3_5_moe")
    if r["openai_layout"]:
        config = to_openai_layout(out, config)
    if r["infer_modes"]:
        for key in ("quantization", "quantization_config"):
            config[key] = {k: v for k, v in config[key].items() if not isinstance(v, dict)}
    save_config(config, out / "config.json")
    if r["kv_config"] is not None:
        (out / "kv_config.json").write_text(json.dumps(r["kv_config"], indent=1) + "\n")


def unstack_experts(out, fused=False):
    """Rewrites a saved model's mlp.switch_mlp.<proj>.weight (experts, out, in) as Hugging Face's
    mlp.experts.<e>.<proj>.weight (out, in), the layout qwen3_moe's sanitize stacks; fused: as
    qwen3_5_moe's mlp.experts.gate_up_proj (experts, 2 * hidden, in) and experts.down_proj."""
    path = out / "model.safetensors"
    weights = mx.load(str(path))
    split = {}
    for key, value in weights.items():
        prefix, sep, proj = key.partition(".mlp.switch_mlp.")
        if not sep:
            split[key] = value
            continue
        assert proj.endswith(".weight"), f"{key}: only float experts can be unstacked"
        if fused:
            # qwen3_5_moe: experts.gate_up_proj (E, 2 * I, H), gate first; experts.down_proj.
            if proj.startswith("gate_proj"):
                up = weights[f"{prefix}.mlp.switch_mlp.up_proj.weight"]
                split[f"{prefix}.mlp.experts.gate_up_proj"] = mx.concatenate([value, up], -2)
            elif proj.startswith("down_proj"):
                split[f"{prefix}.mlp.experts.down_proj"] = value
            continue
        for e in range(value.shape[0]):
            split[f"{prefix}.mlp.experts.{e}.{proj}"] = value[e]
    mx.save_safetensors(str(path), split, metadata={"format": "mlx"})
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] = {k: "model.safetensors" for k in sorted(split)}
    index_path.write_text(json.dumps(index, indent=4) + "\n")


def to_openai_layout(out, config):
    """Rewrites a saved gpt-oss model whose experts alone are MXFP4 into the layout of OpenAI's
    checkpoints, which gpt_oss.sanitize undoes: gate and up interleaved by output row as
    mlp.experts.gate_up_proj_{blocks,scales,bias}, packed weights as uint8 blocks
    (experts, out, in / 32, 16), down_proj_{blocks,scales,bias}, and config.json's
    quantization_config {"quant_method": "mxfp4"} instead of a quantization block."""
    path = out / "model.safetensors"
    weights = mx.load(str(path))
    result = {}

    def blocks(w):
        e, o, _ = w.shape
        return w.view(mx.uint8).reshape(e, o, -1, 16)

    for key, value in weights.items():
        prefix, sep, rest = key.partition(".mlp.experts.")
        if not sep:
            result[key] = value
            continue
        proj, part = rest.split(".")
        base = f"{prefix}.mlp.experts."
        if proj == "down_proj":
            name = {"weight": "down_proj_blocks", "scales": "down_proj_scales",
                    "bias": "down_proj_bias"}[part]
            result[base + name] = blocks(value) if part == "weight" else value
        elif proj == "gate_proj":
            up = weights[f"{base}up_proj.{part}"]
            if part == "bias":
                result[base + "gate_up_proj_bias"] = mx.stack([value, up], -1).flatten(-2)
            else:
                both = mx.stack([value, up], -2).flatten(-3, -2)  # rows g0, u0, g1, u1, ...
                result[base + ("gate_up_proj_blocks" if part == "weight" else
                               "gate_up_proj_scales")] = blocks(both) if part == "weight" else both
    mx.save_safetensors(str(path), result, metadata={"format": "mlx"})
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] = {k: "model.safetensors" for k in sorted(result)}
    index_path.write_text(json.dumps(index, indent=4) + "\n")
    config = {k: v for k, v in config.items() if k not in ("quantization", "quantization_config")}
    config["quantization_config"] = {"quant_method": "mxfp4"}
    return config


def greedy(logits):
    """generate_step's sampling: argmax of the last position's log-probabilities."""
    last = logits[:, -1, :]
    logprobs = last - mx.logsumexp(last, keepdims=True)
    return mx.argmax(logprobs, axis=-1)


def tap(module, store, key):
    """Makes `module` record its output (the first element of a tuple) in store[key] on every
    call, without changing it: the reference for lmx's hidden-state tap."""
    cls = type(module)

    def __call__(self, *args, **kwargs):
        result = cls.__call__(self, *args, **kwargs)
        store[key] = result[0] if isinstance(result, tuple) else result
        return result

    module.__class__ = type(f"Tapped{cls.__name__}", (cls,), {"__call__": __call__})


def drive(prompt, prefill_step, decode_steps, call):
    """generate_step's call order: the prompt except its last token in prefill_step chunks, the
    last prompt token, then decode_steps steps fed with the previous token; call(tokens, kind)
    returns the next token for non-prefill calls. Returns the generated tokens."""
    rest = prompt
    while len(rest) > 1:
        n = min(prefill_step, len(rest) - 1)
        call(rest[:n], "prefill")
        rest = rest[n:]
    token = call(rest, "last_prompt")
    generated = [token]
    for _ in range(decode_steps):
        token = call([token], "decode")
        generated.append(token)
    return generated


def record_run(r, out):
    """Loads the saved directory with mlx-lm and replays generate_step, recording every call, and
    for the first call and the first decode step also every layer's output and the final norm's."""
    model, _ = load_model(out)
    taps = {}
    inner = getattr(model, "language_model", model).model
    for i, layer in enumerate(inner.layers):
        tap(layer, taps, i)
    tap(inner.norm, taps, "final")
    key = mx.random.key(seed_of(r["name"]) + 1)
    prompt = mx.random.randint(0, r["config"]["vocab_size"], (r["prompt_len"],), key=key).tolist()
    cache = make_prompt_cache(model)
    arrays, calls = {}, []
    kv = r["kv"] or {}

    def call(tokens, kind):
        key = f"call_{len(calls):03d}"
        ids = mx.array([tokens], dtype=mx.int32)
        # The first cache with an offset (a hybrid's linear-attention layers have none).
        offset = next((c.offset for c in cache if hasattr(c, "offset")), 0)
        logits = model(ids, cache=cache)
        # generate_step quantizes the cache after every model call (prefill chunk or step).
        maybe_quantize_kv_cache(cache, kv.get("start"), kv.get("group_size"), kv.get("bits"),
                                r["kv_config"])
        entry = dict(key=key, kind=kind, offset=offset, length=len(tokens))
        if kind == "prefill":
            mx.eval(logits, [c.state for c in cache])
            entry["eval_cache"] = True
        else:
            token = greedy(logits)
            mx.eval(logits, token)
            entry["eval_cache"] = False
            entry["next_token"] = token.item()
        arrays[f"{key}.tokens"] = ids
        arrays[f"{key}.logits"] = logits
        if not calls or (kind == "decode" and calls[-1]["kind"] != "decode"):
            entry["tap"] = True
            for name, state in taps.items():
                arrays[f"{key}.tap.{name}"] = state
        calls.append(entry)
        return entry.get("next_token")

    generated = drive(prompt, r["prefill_step"], r["decode"], call)

    mx.save_safetensors(str(out / "reference.safetensors"), arrays, metadata={"format": "mlx"})
    logits_dtype = str(arrays["call_000.logits"].dtype).removeprefix("mlx.core.")
    reference = dict(
        row=r["name"],
        prompt=prompt,
        prefill_step=r["prefill_step"],
        generated=generated,
        logits_dtype=logits_dtype,
        kv_cache=r["kv"],
        cache_types=[type(c).__name__ for c in cache],
        calls=calls,
    )
    (out / "reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    return len(calls), logits_dtype


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--rows", nargs="*", help="only these rows (default: all)")
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                    help="where the reference runs: parity holds per backend (default: cpu)")
    args = ap.parse_args()

    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    root = args.out_dir / "parity"
    if root.exists() and not args.rows:
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)

    start = time.time()
    index = []
    for r in ROWS:
        if args.rows and r["name"] not in args.rows:
            continue
        out = root / r["name"]
        if out.exists():
            shutil.rmtree(out)
        out.mkdir()
        mx.random.seed(seed_of(r["name"]))
        write_model(r, out)
        num_calls, logits_dtype = record_run(r, out)
        qt = r["quant"]
        index.append(
            dict(
                name=r["name"],
                model_type=r["config"]["model_type"],
                dtype=r["dtype"],
                logits_dtype=logits_dtype,
                quantization=None if qt is None else {k: v for k, v in qt.items() if v},
                kv_cache=r["kv"],
                kv_config=r["kv_config"],
                prompt_len=r["prompt_len"],
                prefill_step=r["prefill_step"],
                num_calls=num_calls,
                tiers=r["tiers"],
            )
        )
    meta = dict(mlx_version=mx.__version__, mlx_lm_version=mlx_lm.__version__, rows=index)
    (root / "index.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"gen_tiny_models: {len(index)} rows in {root} ({time.time() - start:.1f}s)")


if __name__ == "__main__":
    sys.exit(main())
