#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer targets (DIR/<target>/), small valid inputs made with
the real libraries (mlx's save_safetensors, mlx-lm's save_prompt_cache, gguf-py's GGUFWriter,
tokenizers' trainers) and fixed seeds. bench/fuzz.sh runs it into build-fuzz/seeds (nothing of it
is committed):  .venv/bin/python scripts/gen_fuzz_seeds.py DIR"""
import json
import struct
import sys
import tempfile
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache, save_prompt_cache
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

TEXT = ["Hello world, this is a tiny corpus.", "Ünïcode façade — 東京 🙂 tabs\tand\nlines",
        "def f(x):\n    return x + 1  # code", "1234567890 numbers 3.14 and <tags>"] * 4


def put(root, target, name, data):
    d = root / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def dump(obj):
    return json.dumps(obj, ensure_ascii=False)


def requests(root):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    tool = {"type": "function", "function": {"name": "get_weather", "description": "d",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}}
    chat = [
        {"model": "m", "messages": msgs},
        {"messages": msgs, "stream": True, "stream_options": {"include_usage": True},
         "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
         "stop": ["\n", "END"], "seed": 3, "logprobs": True, "top_logprobs": 2,
         "repetition_penalty": 1.1, "logit_bias": {"12": -100}},
        {"messages": msgs + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather",
             "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
         "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
         "parallel_tool_calls": False},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
         "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
             "type": "object", "properties": {"n": {"type": "integer"}}}}},
         "chat_template_kwargs": {"enable_thinking": False}, "adapter": "x",
         "num_draft_tokens": 3, "speculative": True},
        {"messages": msgs, "response_format": {"type": "json_object"}, "n": 1,
         "max_completion_tokens": 5, "presence_penalty": 0.5, "frequency_penalty": 0.1},
    ]
    for i, b in enumerate(chat):
        put(root, "request_chat", f"seed-{i}.json", dump(b))
    comp = [{"prompt": "Once upon", "max_tokens": 8}, {"prompt": [1, 2, 3], "echo": True,
            "logprobs": 3, "stream": True, "stop": "x"}, {"prompt": ["a"], "temperature": 0}]
    for i, b in enumerate(comp):
        put(root, "request_completions", f"seed-{i}.json", dump(b))
    anth = [{"model": "m", "max_tokens": 32, "system": "Be brief.",
             "messages": [{"role": "user", "content": "Hi"}]},
            {"max_tokens": 32, "system": [{"type": "text", "text": "s"}], "stream": True,
             "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                          {"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
                           "name": "get_weather", "input": {"city": "Paris"}}]},
                          {"role": "user", "content": [{"type": "tool_result",
                           "tool_use_id": "t1", "content": "sunny"}]}],
             "tools": [{"name": "get_weather", "description": "d", "input_schema":
                        tool["function"]["parameters"]}], "tool_choice": {"type": "auto"},
             "thinking": {"type": "enabled", "budget_tokens": 100}, "stop_sequences": ["x"],
             "temperature": 0.5, "top_p": 0.9, "top_k": 5}]
    for i, b in enumerate(anth):
        put(root, "request_anthropic", f"seed-{i}.json", dump(b))
    resp = [{"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 16},
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                       {"type": "function_call", "call_id": "c1", "name": "get_weather",
                        "arguments": "{\"city\":\"Paris\"}"},
                       {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
             "tools": [{"type": "function", "name": "get_weather",
                        "parameters": tool["function"]["parameters"]}],
             "text": {"format": {"type": "json_schema", "name": "p",
                                 "schema": {"type": "object"}}}, "stream": True},
            {"input": "again", "previous_response_id": "resp_seed", "store": True}]
    for i, b in enumerate(resp):
        put(root, "request_responses", f"seed-{i}.json", dump(b))
    emb = [{"model": "m", "input": "hello"}, {"input": ["a", "b"], "encoding_format": "base64",
           "dimensions": 8}, {"input": [[1, 2, 3], [4]]}]
    for i, b in enumerate(emb):
        put(root, "request_embeddings", f"seed-{i}.json", dump(b))


def tool_calls(root):
    # byte 0: format (hermes, llama3, mistral, gemma, gemma4, qwen3_coder, harmony); byte 1: bit 0 starts inside <think>,
    # the rest the chunk size - 1 (fuzz_tool_calls.cpp).
    outs = [
        (0, '<think>hm</think>Sure.<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'),
        (0, '<tool_call>{"name": "g", "arguments": "{}"}</tool_call><tool_call>{"name": "h"}</tool_call>'),
        (1, '<|python_tag|>{"name": "f", "parameters": {"x": [1, 2]}}'),
        (1, '{"name": "f", "arguments": {"q": "a\\"b"}}'),
        (2, '[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}, "id": "abc123def"}]'),
        (2, '[TOOL_CALLS]f[ARGS]{"x": 1}'),
        (3, '<start_function_call>call:f{a:<escape>text, with } braces<escape>,n:1,b:true,'
            'l:[1,2],o:{k:2}}<end_function_call>'),
        (4, '<|tool_call>call:f{a:<|"|>text<|"|>,n:-1.5e3,z:null}<tool_call|>'),
        (5, '<think>plan</think>\n\n<tool_call>\n<function=f>\n<parameter=s>\nhello\n</parameter>\n'
            '<parameter=i>\n3\n</parameter>\n<parameter=o>\n{"k": [1]}\n</parameter>\n</function>\n'
            '</tool_call>'),
        (5, 'text <tool_call>\n<function=f>\n<parameter=b>\ntrue\n</parameter>\n<parameter=n>\n-1.5\n'
            '</parameter>\n<parameter=x>\n[1, 2]\n</parameter>\n</function>\n</tool_call>'
            '<tool_call>\n<function=f>\n</function>\n</tool_call>'),
        (6, '<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary '
            'to=functions.f <|constrain|>json<|message|>{"s": "x", "i": 2}<|call|>'),
        (6, '<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"b": false}'
            '<|call|><|channel|>final<|message|>done<|return|>'),
    ]
    for i, (fmt, text) in enumerate(outs):
        put(root, "tool_calls", f"seed-{i}.txt", bytes([fmt, 2 * 7 + (i % 2)]) + text.encode())


def safetensors(root):
    mx.random.seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        arrays = {"a": mx.arange(6, dtype=mx.float32).reshape(2, 3),
                  "b": mx.array([1, 2, 3], dtype=mx.int8), "c": mx.zeros((0, 4)),
                  "d": mx.random.normal((4,)).astype(mx.bfloat16),
                  "e": mx.array(True), "f": mx.ones((2, 2), dtype=mx.float16),
                  "g": mx.array([7], dtype=mx.uint32)}
        p = f"{tmp}/x.safetensors"
        mx.save_safetensors(p, arrays, {"format": "mlx", "note": "seed"})
        put(root, "safetensors", "seed-0.safetensors", Path(p).read_bytes())
        mx.save_safetensors(p, {"w": mx.arange(4, dtype=mx.int32)})
        put(root, "safetensors", "seed-1.safetensors", Path(p).read_bytes())
    index = {"metadata": {"total_size": 1234},
             "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                            "lm_head.weight": "model-00002-of-00002.safetensors"}}
    put(root, "safetensors_index", "seed-0.json", json.dumps(index, indent=2))
    put(root, "safetensors_index", "seed-1.json", '{"weight_map": {}}')


def write_gguf(path, tok_model, arch="llama"):
    w = gguf.GGUFWriter(path, arch)
    w.add_uint32("test.u32", 7)
    w.add_int8("test.i8", -3)
    w.add_float64("test.f64", 2.5)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "s")
    w.add_array("test.arr", [1, 2, 3])
    w.add_uint32("general.alignment", 32)
    w.add_context_length(64)
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((2, 32)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 32)).astype(np.float16))
    q8 = gguf.quants.quantize(rng.standard_normal((2, 32)).astype(np.float32),
                              gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q8", q8, raw_shape=q8.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    q4 = gguf.quants.quantize(rng.standard_normal((1, 32)).astype(np.float32),
                              gguf.GGMLQuantizationType.Q4_0)
    w.add_tensor("q4", q4, raw_shape=q4.shape, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    if tok_model == "gpt2":
        tokens = ["a", "b", "c", "ab", "abc", "Ġ", "Ġa", "<|end|>"]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types([1, 1, 1, 1, 1, 1, 1, 3])
        w.add_token_merges(["a b", "ab c", "Ġ a"])
        w.add_eos_token_id(7)
    elif tok_model == "llama":
        tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + \
                 ["▁", "▁a", "b", "▁ab", "c"]
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores([0.0] * 259 + [-1.0, -2.0, -3.0, -1.5, -4.0])
        w.add_token_types([2, 3, 3] + [6] * 256 + [1] * 5)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
        w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_seeds(root):
    with tempfile.TemporaryDirectory() as tmp:
        for i, (tok, arch) in enumerate([(None, "llama"), ("gpt2", "qwen2"), ("llama", "llama"),
                                         ("llama", "gemma3")]):
            p = f"{tmp}/{i}.gguf"
            write_gguf(p, tok, arch)
            put(root, "gguf", f"seed-{i}.gguf", Path(p).read_bytes())


def configs(root):
    cfgs = [{"model_type": "llama", "hidden_size": 64, "quantization": {"group_size": 64, "bits": 4}},
            {"model_type": "qwen3", "quantization": {"group_size": 32, "bits": 8, "mode": "affine",
             "model.embed_tokens": {"group_size": 64, "bits": 6}, "lm_head": False}},
            {"model_type": "gemma3_text", "quantization": {"group_size": 32, "bits": 4,
             "mode": "mxfp4"}, "eos_token_id": [1, 106]},
            {"model_type": "llama", "quantization": None}]
    for i, c in enumerate(cfgs):
        put(root, "config", f"seed-{i}.json", json.dumps(c))
    adapters = [{"fine_tune_type": "lora", "num_layers": 4, "lora_parameters":
                 {"rank": 8, "scale": 20.0, "dropout": 0.0, "keys": ["self_attn.q_proj"]}},
                {"fine_tune_type": "dora", "num_layers": -1, "lora_parameters":
                 {"rank": 2, "scale": 1.5}},
                {"fine_tune_type": "full", "num_layers": 2}]
    for i, c in enumerate(adapters):
        put(root, "adapter_config", f"seed-{i}.json", json.dumps(c))


def tokenizer_seeds(root):
    def bytelevel():
        t = Tokenizer(models.BPE())
        t.normalizer = normalizers.NFC()
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        t.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>"],
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        t.train_from_iterator(TEXT, tr)
        return t

    def metaspace():
        t = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        t.pre_tokenizer = pre_tokenizers.Metaspace()
        t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                       decoders.Fuse(), decoders.Strip(" ", 1, 0)])
        tr = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"])
        t.train_from_iterator(TEXT, tr)
        return t

    def split_digits():
        t = Tokenizer(models.BPE())
        t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                   pre_tokenizers.ByteLevel(add_prefix_space=True)])
        t.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=280, special_tokens=["<s>"],
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        t.train_from_iterator(TEXT, tr)
        return t

    for i, make in enumerate([bytelevel, metaspace, split_digits]):
        t = make()
        text = "Hello <|im_start|>world 123 Ünï 🙂\n  x" if i != 1 else "Hello world <s> 東京"
        put(root, "tokenizer", f"seed-{i}.bin", t.to_str().encode() + b"\0" + text.encode())


def templates(root):
    tpls = [
        # ChatML with tools and thinking, the shapes most models use.
        "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- for tool in tools %}{{- tool | tojson }}"
        "{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}"
        "{%- if message.role == 'tool' %}{{- '<tool_response>' + message.content + '</tool_response>' }}"
        "{%- elif message.tool_calls %}{%- for tc in message.tool_calls %}{{- '<tool_call>' }}"
        "{{- tc.function | tojson }}{{- '</tool_call>' }}{%- endfor %}{%- else %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
        "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
        "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
        "{%- endif %}{%- endif %}",
        # Macros, namespaces, filters, slicing, loops with else and conditions.
        "{% macro render(m, sep=', ') %}{{ m.role | upper }}{{ sep }}{{ m.content[:20] }}{% endmacro %}"
        "{% set ns = namespace(n=0) %}{{ bos_token }}{% for m in messages if m.role != 'system' %}"
        "{% set ns.n = ns.n + 1 %}{{ render(m) }}{{ loop.index }}/{{ loop.length }}"
        "{% if not loop.last %}|{% endif %}{% else %}none{% endfor %}"
        "{{ ns.n }}{{ messages | length }}{{ (messages | map(attribute='role') | list) | join(',') }}"
        "{{ '%d-%s' % (3, 'x') }}{{ [1, 2, 3] | selectattr('real') | list }}{{ {'a': 1}.items() | list }}"
        "{% if messages[0].content is string and 'Be' in messages[0].content %}yes{% endif %}"
        "{{ raise_exception('bad') if messages | length > 99 else '' }}{{ eos_token }}",
        # Whitespace control, raw blocks, strftime and dict methods.
        "{%- set sys = messages[0].content if messages[0].role == 'system' else '' -%}"
        "{% raw %}{{ not a tag }}{% endraw %}{{ sys.split(' ') | reverse | list }}"
        "{{ strftime_now('%Y') | length }}{{ messages[-1].get('content', '') | replace('4', 'four') }}"
        "{%- for k, v in {'x': 1, 'y': [2]} | dictsort %}{{ k }}={{ v }}{% endfor -%}",
    ]
    msgs = '[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi 42"}]'
    for i, t in enumerate(tpls):
        put(root, "chat_template", f"seed-{i}.bin",
            t.encode() + b"\0" + msgs.encode() + b"\0" + b'{"enable_thinking": false}')


def schemas(root):
    cases = [
        ({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
          "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"},
          "maxItems": 3}}, "required": ["name"]}, '{"name": "Ada", "age": 36, "tags": ["x"]}'),
        ({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "number"},
          "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}}},
          "$ref": "#/$defs/node"}, '{"v": 1.5e3, "next": {"v": -2, "next": null}}'),
        ({"enum": ["a", 1, None, True]}, '"a"'),
        ({"type": ["string", "boolean"], "minLength": 1}, 'false'),
        ({"type": "object", "additionalProperties": {"type": "integer"}}, '{"k": 1, "\\u00e9": -0}'),
        ({"const": {"x": [1, 2]}}, '{"x":[1,2]}'),
    ]
    for i, (s, t) in enumerate(cases):
        put(root, "json_schema", f"seed-{i}.bin", json.dumps(s).encode() + b"\0" + t.encode())


def prompt_caches(root):
    mx.random.seed(0)

    def kv(n, D=8):
        return (mx.random.normal((1, 2, n, D)).astype(mx.float16),
                mx.random.normal((1, 2, n, D)).astype(mx.float16))

    sets = []
    c = [KVCache(), KVCache()]
    c[0].update_and_fetch(*kv(3))
    c[1].update_and_fetch(*kv(3))
    sets.append((c, {"model": "tiny"}))
    r = RotatingKVCache(4, keep=1)
    r.update_and_fetch(*kv(3))
    for _ in range(3):
        r.update_and_fetch(*kv(1))
    sets.append(([r], {}))
    q = QuantizedKVCache(group_size=32, bits=8)
    q.update_and_fetch(*kv(2, D=32))
    sets.append(([q, KVCache()], {"tokens": "2"}))
    with tempfile.TemporaryDirectory() as tmp:
        for i, (caches, meta) in enumerate(sets):
            p = f"{tmp}/{i}.safetensors"
            save_prompt_cache(p, caches, meta)
            put(root, "prompt_cache", f"seed-{i}.safetensors", Path(p).read_bytes())


def main():
    root = Path(sys.argv[1])
    requests(root)
    tool_calls(root)
    safetensors(root)
    gguf_seeds(root)
    configs(root)
    tokenizer_seeds(root)
    templates(root)
    schemas(root)
    prompt_caches(root)
    total = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    print(f"{root}: {sum(1 for f in root.rglob('*') if f.is_file())} files, {total} bytes")


if __name__ == "__main__":
    main()
