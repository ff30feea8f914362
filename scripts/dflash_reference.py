"""A reference DFlash block drafter in MLX (arXiv 2602.06036), written from the paper's math
and the z-lab checkpoint layout, for lmx's tests (scripts/gen_dflash.py) and training
(scripts/train_dflash.py).

Layout of a drafter directory (z-lab's Qwen3 drafters): config.json with the Qwen3 sizes,
block_size, num_target_layers and dflash_config {target_layer_ids, mask_token_id}; tensors
fc.weight (hidden, taps * hidden), hidden_norm.weight, layers.i.self_attn.{q,k,v,o}_proj.weight,
layers.i.self_attn.{q,k}_norm.weight, layers.i.{input,post_attention}_layernorm.weight,
layers.i.mlp.{gate,up,down}_proj.weight, norm.weight. No embedding or LM head: the target's.

Forward: ctx = hidden_norm(fc(concat of the target's layer outputs at target_layer_ids)); per
layer, queries from the block (the last committed token, then mask tokens), keys/values from
the context rows (cached, RoPE at their positions) followed by the block's own (RoPE after
them), attention without a mask; the output at block position j >= 1 is the guess for that
position.
"""

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten


def target_layer_ids(num_target_layers, num_draft_layers):
    """Evenly spread taps from layer 1 to num_target_layers - 3 (the paper's choice)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1)))
            for i in range(num_draft_layers)]


class MLP(nn.Module):
    def __init__(self, dims, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dims, hidden, bias=False)
        self.up_proj = nn.Linear(dims, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dims, bias=False)

    def __call__(self, x):
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, d = c["hidden_size"], c["head_dim"]
        self.nq, self.nkv, self.d = c["num_attention_heads"], c["num_key_value_heads"], d
        self.q_proj = nn.Linear(h, self.nq * d, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.o_proj = nn.Linear(self.nq * d, h, bias=False)
        self.q_norm = nn.RMSNorm(d, eps=c["rms_norm_eps"])
        self.k_norm = nn.RMSNorm(d, eps=c["rms_norm_eps"])
        self.rope = nn.RoPE(d, traditional=False, base=c["rope_theta"])

    def heads(self, t, n, norm=None):
        B, T, _ = t.shape
        t = t.reshape(B, T, n, self.d)
        if norm is not None:
            t = norm(t)
        return t.transpose(0, 2, 1, 3)

    def __call__(self, x, ctx, kv, offset):
        """kv: (keys, values) of the earlier context rows or None; -> output, new kv."""
        S = ctx.shape[1]
        q = self.rope(self.heads(self.q_proj(x), self.nq, self.q_norm), offset=offset + S)
        bk = self.rope(self.heads(self.k_proj(x), self.nkv, self.k_norm), offset=offset + S)
        bv = self.heads(self.v_proj(x), self.nkv)
        ck = self.rope(self.heads(self.k_proj(ctx), self.nkv, self.k_norm), offset=offset)
        cv = self.heads(self.v_proj(ctx), self.nkv)
        if kv is not None:
            ck = mx.concatenate([kv[0], ck], axis=2)
            cv = mx.concatenate([kv[1], cv], axis=2)
        keys = mx.concatenate([ck, bk], axis=2)
        values = mx.concatenate([cv, bv], axis=2)
        o = mx.fast.scaled_dot_product_attention(q, keys, values, scale=self.d ** -0.5)
        B, _, L, _ = o.shape
        return self.o_proj(o.transpose(0, 2, 1, 3).reshape(B, L, -1)), (ck, cv)


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c["hidden_size"], c["intermediate_size"])
        self.input_layernorm = nn.RMSNorm(c["hidden_size"], eps=c["rms_norm_eps"])
        self.post_attention_layernorm = nn.RMSNorm(c["hidden_size"], eps=c["rms_norm_eps"])


class Drafter(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        taps = len(c["dflash_config"]["target_layer_ids"])
        self.fc = nn.Linear(taps * c["hidden_size"], c["hidden_size"], bias=False)
        self.hidden_norm = nn.RMSNorm(c["hidden_size"], eps=c["rms_norm_eps"])
        self.layers = [Layer(c) for _ in range(c["num_hidden_layers"])]
        self.norm = nn.RMSNorm(c["hidden_size"], eps=c["rms_norm_eps"])

    def __call__(self, target, block, ctx, cache=None):
        """block (1, L) ids, ctx (1, S, taps * hidden) the new context rows; cache: a list of
        per-layer (keys, values) or None, and the offset, as returned. -> (logits, cache)."""
        kvs, offset = cache if cache is not None else ([None] * len(self.layers), 0)
        h = target.model.embed_tokens(block)
        c = self.hidden_norm(self.fc(ctx))
        new = []
        for layer, kv in zip(self.layers, kvs):
            a, kv = layer.self_attn(layer.input_layernorm(h), c, kv, offset)
            h = h + a
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            new.append(kv)
        return target_head(target, self.norm(h)), (new, offset + ctx.shape[1])


def target_head(target, h):
    if target.args.tie_word_embeddings:
        return target.model.embed_tokens.as_linear(h)
    return target.lm_head(h)


def tapped_forward(target, tokens, cache, layer_ids):
    """mlx-lm's qwen3/llama forward with the outputs of `layer_ids` kept: -> (logits, states
    (1, L, taps * hidden) in layer_ids' order)."""
    from mlx_lm.models.base import create_attention_mask

    m = target.model
    h = m.embed_tokens(tokens)
    mask = create_attention_mask(h, cache[0])
    kept = {}
    for i, (layer, c) in enumerate(zip(m.layers, cache)):
        h = layer(h, mask, c)
        kept[i] = h
    states = mx.concatenate([kept[i] for i in layer_ids], axis=-1)
    return target_head(target, m.norm(h)), states


def greedy_generate(target, drafter, prompt, k, max_tokens):
    """Greedy DFlash decoding in lmx's framing (the target prefills all but the last prompt
    token, each round verifies [y, K proposals]): -> (tokens, accepted per round)."""
    from mlx_lm.models.cache import make_prompt_cache

    ids = drafter.config["dflash_config"]["target_layer_ids"]
    mask_id = drafter.config["dflash_config"]["mask_token_id"]
    cache = make_prompt_cache(target)
    ctx = mx.zeros((1, 0, len(ids) * drafter.config["hidden_size"]))
    if len(prompt) > 1:
        _, ctx = tapped_forward(target, mx.array([prompt[:-1]]), cache, ids)
    dcache = None
    y, out, accepted = prompt[-1], [], []
    while len(out) < max_tokens:
        budget = min(k, max_tokens - len(out))
        logits, dcache = drafter(target, mx.array([[y] + [mask_id] * budget]), ctx, dcache)
        draft = mx.argmax(logits[0, 1:], axis=-1).tolist()
        logits, states = tapped_forward(target, mx.array([[y] + draft]), cache, ids)
        t = mx.argmax(logits[0], axis=-1).tolist()
        n = 0
        while n < budget and t[n] == draft[n]:
            n += 1
        out += draft[:n] + [t[n]]
        accepted.append(n)
        for c in cache:
            c.trim(budget - n)
        ctx = states[:, : n + 1]
        y = t[n]
    return out[:max_tokens], accepted


def drafter_config(target_config, num_layers, block_size, mask_token_id, **sizes):
    """A z-lab layout config.json for a drafter of `num_layers` layers reading `target_config`'s
    model (same hidden size and vocabulary)."""
    t = target_config
    c = dict(
        architectures=["DFlashDraftModel"],
        model_type="qwen3",
        attention_bias=False,
        block_size=block_size,
        dflash_config=dict(
            mask_token_id=mask_token_id,
            target_layer_ids=target_layer_ids(t["num_hidden_layers"], num_layers),
        ),
        head_dim=sizes.get("head_dim", t.get("head_dim", t["hidden_size"] // t["num_attention_heads"])),
        hidden_act="silu",
        hidden_size=t["hidden_size"],
        intermediate_size=sizes.get("intermediate_size", t["intermediate_size"]),
        layer_types=["full_attention"] * num_layers,
        max_position_embeddings=t.get("max_position_embeddings", 4096),
        num_attention_heads=sizes.get("num_attention_heads", t["num_attention_heads"]),
        num_hidden_layers=num_layers,
        num_key_value_heads=sizes.get("num_key_value_heads", t["num_key_value_heads"]),
        num_target_layers=t["num_hidden_layers"],
        rms_norm_eps=t.get("rms_norm_eps", 1e-6),
        rope_scaling=None,
        rope_theta=t.get("rope_theta", 10000.0),
        tie_word_embeddings=False,
        vocab_size=t["vocab_size"],
        dtype="float32",
    )
    return c


def save_drafter(drafter, out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(drafter.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(drafter.config, indent=1) + "\n")


def load_drafter(path):
    path = Path(path)
    c = json.loads((path / "config.json").read_text())
    d = Drafter(c)
    d.load_weights(str(path / "model.safetensors"))
    return d
