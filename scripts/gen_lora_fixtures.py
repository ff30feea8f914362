#!/usr/bin/env python3
"""LoRA / DoRA / full fine-tune adapters in mlx-lm's format and mlx-lm's logits with them loaded.

    gen_lora_fixtures.py OUT_DIR [--smollm2 MODEL_DIR]

For every row of ROWS: the tiny random base model of gen_tiny_models.py (same configs, same
write_model), saved to OUT_DIR/<row>/; then an adapter made with mlx-lm's own training setup
(model.freeze(), tuner.utils.linear_to_lora_layers with the row's num_layers and
lora_parameters, DoRA with use_dora; for `full`, the last num_layers layers unfrozen), its
trainable parameters redrawn (lora_b is zero at initialization, which would make the adapter a
no-op), and saved as mlx-lm's trainer saves it: adapters.safetensors = the flattened
trainable_parameters(), adapter_config.json = the training arguments, in OUT_DIR/<row>/adapter/.
The reference run is gen_tiny_models.record_run with the model loaded as mlx_lm.utils.load loads
one with adapter_path (load_model, tuner.utils.load_adapters, model.eval()); the tiny models have
no tokenizer, which is all `load` adds.

With --smollm2, an adapter for the real default model (OUT_DIR/smollm2/adapter/) and the greedy
text of mlx_lm.generate for it, loaded with mlx_lm.utils.load(path, adapter_path=...), in
OUT_DIR/smollm2/reference.json: the reference of the `lmx generate --adapter-path` smoke test.

OUT_DIR/index.json lists the rows. Everything is deterministic (fixed seeds).
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.tuner.utils import linear_to_lora_layers, load_adapters
from mlx_lm.utils import load, load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_tiny_models as tiny  # noqa: E402
from gen_tiny_models import (  # noqa: E402
    GEMMA3,
    GEMMA3_TEXT,
    GEMMA4_MOE,
    GEMMA4_TEXT,
    LLAMA,
    QWEN2,
    QWEN3,
    q,
    row,
    seed_of,
    write_model,
)

# The training arguments mlx_lm.lora writes beside the ones that matter for loading.
TRAINING_ARGS = dict(
    model="tiny",
    train=True,
    data="data/",
    seed=0,
    batch_size=4,
    iters=100,
    val_batches=25,
    learning_rate=1e-5,
    steps_per_report=10,
    steps_per_eval=200,
    resume_adapter_file=None,
    save_every=100,
    test=False,
    test_batches=500,
    max_seq_length=2048,
    grad_checkpoint=False,
    grad_accumulation_steps=1,
    mask_prompt=False,
    optimizer="adam",
    optimizer_config={"adam": {}},
    lr_schedule=None,
    report_to=None,
    project_name=None,
    clear_cache_threshold=0,
    config=None,
)


def adapter(kind="lora", num_layers=16, rank=8, scale=20.0, dropout=0.0, keys=None):
    """adapter_config.json's loading fields: fine_tune_type, num_layers, lora_parameters."""
    params = dict(rank=rank, scale=scale, dropout=dropout)
    if keys is not None:
        params["keys"] = keys
    return dict(fine_tune_type=kind, num_layers=num_layers, lora_parameters=params)


def lora_row(name, config, prompt_len, prefill_step, adapter_cfg, **kw):
    r = row(name, config, prompt_len, prefill_step, **kw)
    r["adapter"] = adapter_cfg
    return r


ROWS = [
    # last layer of 2, every linear of it (mlx-lm's default keys), dropout ignored at inference
    lora_row("llama_lora_last1", LLAMA, 21, 8, adapter(num_layers=1, rank=4, scale=2.0,
                                                      dropout=0.05)),
    # every layer (num_layers -1), explicit keys, 4-bit base layers (QuantizedLinear)
    lora_row("llama_q4_lora_keys", LLAMA, 20, 8,
             adapter(num_layers=-1, rank=8, scale=1.5,
                     keys=["self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"]),
             quant=q(4)),
    # a top-level key: the untied lm_head beside the layers' o_proj
    lora_row("llama_untied_lora_head", LLAMA, 13, 2048,
             adapter(num_layers=2, rank=4, scale=1.0, keys=["self_attn.o_proj", "lm_head"]),
             tie_word_embeddings=False),
    # the tied embedding (LoRAEmbedding: the lookup and as_linear, the head)
    lora_row("qwen3_lora_embed", QWEN3, 27, 8,
             adapter(num_layers=1, rank=4, scale=1.0,
                     keys=["model.embed_tokens", "self_attn.k_proj", "mlp.gate_proj"])),
    lora_row("qwen2_lora_bias", QWEN2, 23, 8, adapter(num_layers=2, rank=4, scale=2.0)),
    lora_row("qwen3_q8_lora", QWEN3, 17, 8, adapter(num_layers=1, rank=8, scale=2.0), quant=q(8)),
    # float32 quantized rows: also the tier L3 gates (tests/models/test_lora.cpp)
    lora_row("llama_f32_q4_lora", LLAMA, 20, 8, adapter(num_layers=1, rank=8, scale=2.0),
             dtype="float32", quant=q(4)),
    lora_row("qwen3_f32_q8_lora_keys", QWEN3, 17, 8,
             adapter(num_layers=2, rank=4, scale=2.0,
                     keys=["self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj"]),
             dtype="float32", quant=q(8)),
    lora_row("qwen2_f32_q4_lora", QWEN2, 12, 8, adapter(num_layers=2, rank=4, scale=2.0),
             dtype="float32", quant=q(4)),
    # DoRA on float and quantized base layers
    lora_row("llama_dora", LLAMA, 19, 8, adapter("dora", num_layers=1, rank=4, scale=2.0),
             attention_bias=True, tie_word_embeddings=False),
    lora_row("llama_f32_q4_dora", LLAMA, 20, 8,
             adapter("dora", num_layers=2, rank=4, scale=2.0,
                     keys=["self_attn.q_proj", "mlp.down_proj"]),
             dtype="float32", quant=q(4)),
    # full fine-tune: the last layer's parameters replaced
    lora_row("llama_full_last1", LLAMA, 15, 8, adapter("full", num_layers=1)),
    # gemma3 text, its multimodal wrapper (layers under language_model.model), gemma4 text
    lora_row("gemma3_text_lora_last3", GEMMA3_TEXT, 30, 8, adapter(num_layers=3, rank=4, scale=2.0),
             tied_head=True),
    lora_row("gemma3_wrapper_lora", GEMMA3, 21, 8,
             adapter(num_layers=2, rank=4, scale=2.0, keys=["self_attn.v_proj", "mlp.up_proj"]),
             tied_head=True),
    lora_row("gemma4_text_lora", GEMMA4_TEXT, 22, 8, adapter(num_layers=3, rank=4, scale=1.0)),
    # gemma4 MoE: router.proj and the experts' SwitchLinears (LoRASwitchLinear), unsorted and
    # sorted (L * top_k >= 64) expert rows
    lora_row("gemma4_moe_f32_lora", GEMMA4_MOE, 30, 8, adapter(num_layers=2, rank=4, scale=1.0),
             dtype="float32"),
    lora_row("gemma4_moe_sorted_f32_lora", GEMMA4_MOE, 41, 2048,
             adapter(num_layers=1, rank=4, scale=1.0,
                     keys=["experts.switch_glu.gate_proj", "experts.switch_glu.down_proj"]),
             dtype="float32"),
    lora_row("gemma4_moe_q4_lora", GEMMA4_MOE, 30, 8, adapter(num_layers=2, rank=4, scale=1.0),
             quant=q(4)),
]


def redraw_trainable(model, dora):
    """Nonzero random adapter parameters: lora_a, lora_b ~ N(0, 1/fan_in); DoRA magnitudes m =
    the row norms of the base weight times 1 + N(0, 0.1^2); full fine-tune weights perturbed."""
    params = []
    for name, p in tree_flatten(model.trainable_parameters()):
        noise = mx.random.normal(p.shape, dtype=mx.float32)
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "lora_a":
            value = noise * (p.shape[0] ** -0.5)
        elif leaf == "lora_b":
            value = noise * (p.shape[0] ** -0.5)
        elif leaf == "m":
            value = p * (1.0 + 0.1 * noise)
        else:  # full fine-tune: a perturbed copy, in the parameter's dtype
            value = (p.astype(mx.float32) + 0.05 * noise).astype(p.dtype)
        params.append((name, value.astype(p.dtype)))
    model.update(tree_unflatten(params))


def make_adapter(model, cfg, out):
    """mlx_lm.lora's train_model setup, then the trainer's save."""
    model.freeze()
    if cfg["fine_tune_type"] == "full":
        for layer in model.layers[-max(cfg["num_layers"], 0):]:
            layer.unfreeze()
    else:
        linear_to_lora_layers(model, cfg["num_layers"], cfg["lora_parameters"],
                              use_dora=cfg["fine_tune_type"] == "dora")
    redraw_trainable(model, cfg["fine_tune_type"] == "dora")
    weights = dict(tree_flatten(model.trainable_parameters()))
    mx.eval(weights)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), weights)
    args = dict(TRAINING_ARGS, adapter_path=str(out), **cfg)
    if cfg["fine_tune_type"] == "full":
        args["lora_parameters"] = None
    (out / "adapter_config.json").write_text(json.dumps(args, indent=4) + "\n")
    return sorted(weights)


def write_row(r, root):
    out = root / r["name"]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    mx.random.seed(seed_of(r["name"]))
    write_model(r, out)
    base, _ = load_model(out)
    names = make_adapter(base, r["adapter"], out / "adapter")

    def load_with_adapter(path):
        # mlx_lm.utils.load(path, adapter_path=...) without the tokenizer.
        model, config = load_model(path)
        model = load_adapters(model, str(out / "adapter"))
        model.eval()
        return model, config

    tiny.load_model = load_with_adapter
    try:
        num_calls, logits_dtype = tiny.record_run(r, out)
    finally:
        tiny.load_model = load_model
    return dict(
        name=r["name"],
        model_type=r["config"]["model_type"],
        dtype=r["dtype"],
        quantization=None if r["quant"] is None else {k: v for k, v in r["quant"].items() if v},
        fine_tune_type=r["adapter"]["fine_tune_type"],
        num_layers=r["adapter"]["num_layers"],
        adapter_tensors=len(names),
        num_calls=num_calls,
        logits_dtype=logits_dtype,
    )


SMOLLM2_PROMPT = ("<|im_start|>user\nWhat is the capital of France? Answer in one sentence."
                  "<|im_end|>\n<|im_start|>assistant\n")


def write_smollm2(model_dir, root):
    """An adapter on the real 4-bit SmolLM2 (its last 8 layers' q/v/down projections) and the
    greedy text mlx_lm.generate gives with it."""
    from mlx_lm import generate

    out = root / "smollm2"
    if out.exists():
        shutil.rmtree(out)
    mx.random.seed(1234)
    base, _ = load_model(Path(model_dir))
    cfg = adapter(num_layers=8, rank=8, scale=4.0,
                  keys=["self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"])
    make_adapter(base, cfg, out / "adapter")
    model, tokenizer = load(str(model_dir), adapter_path=str(out / "adapter"))
    text = generate(model, tokenizer, SMOLLM2_PROMPT, max_tokens=24, verbose=False)
    base_model, _ = load(str(model_dir))
    base_text = generate(base_model, tokenizer, SMOLLM2_PROMPT, max_tokens=24, verbose=False)
    ref = dict(prompt=SMOLLM2_PROMPT, max_tokens=24, text=text, base_text=base_text)
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--rows", nargs="*", help="only these rows (default: all)")
    ap.add_argument("--smollm2", type=Path, help="the default model's directory")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    root = args.out_dir
    root.mkdir(parents=True, exist_ok=True)
    start = time.time()
    index = [write_row(r, root) for r in ROWS if not args.rows or r["name"] in args.rows]
    if args.smollm2:
        write_smollm2(args.smollm2, root)
    (root / "index.json").write_text(json.dumps(dict(rows=index), indent=1) + "\n")
    print(f"gen_lora_fixtures: {len(index)} rows in {root} ({time.time() - start:.1f}s)")


if __name__ == "__main__":
    sys.exit(main())
