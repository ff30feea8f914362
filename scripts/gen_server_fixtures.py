#!/usr/bin/env python3
"""Tool-call parser fixtures for lmx serve: model outputs in each family's native format and what
mlx_lm's own tool parsers (mlx_lm.tool_parsers) make of them.

    gen_server_fixtures.py OUT_DIR   ->  OUT_DIR/tool_calls.json

Each case: {"format", "block" (the text between the format's markers), "calls": [{"name",
"arguments"}]}; calls is [] where mlx_lm's parser rejects the block (lmx then keeps it as text).
qwen3_coder cases also carry "tools" (the request's OpenAI tools), whose JSON schemas type the
parameter values.
"""
import json
import sys
from pathlib import Path

from mlx_lm.tool_parsers import function_gemma, gemma4, json_tools, mistral, qwen3_coder

PARSERS = {"hermes": json_tools, "mistral": mistral, "gemma": function_gemma, "gemma4": gemma4,
           "qwen3_coder": qwen3_coder}

# One tool whose parameters cover every typing branch of qwen3_coder._convert_param_value.
QWEN_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"},
    "b": {"type": "boolean"}, "o": {"type": "object"}, "a": {"type": "array"},
    "u": {"description": "no type: JSON objects and lists are parsed"},
    "e": {"type": "enum"}, "x": {"type": "custom"}, "t": {"type": ["integer", "null"]}}}}}]


def qwen(*params, name="f"):
    body = "".join("<parameter=%s>\n%s\n</parameter>\n" % p for p in params)
    return "\n<function=%s>\n%s</function>\n" % (name, body)

CASES = {
    "hermes": [
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
        '\n{"name": "add", "arguments": {"a": 1, "b": 2.5, "flags": [true, null]}}\n',
        '{"name": "nested", "arguments": {"q": {"z": 1, "a": [1, {"k": "v"}]}}}',
        '{"name": "unicode", "arguments": {"text": "h\\u00e9llo \\u4e16\\u754c"}}',
        '{"name": "no_args", "arguments": {}}',
        '{"name": "broken", "arguments": {"a": 1}',
    ],
    "mistral": [
        '[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        '[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": "two"}}]',
        'get_weather[ARGS]{"city": "Paris", "days": 3}',
        'f[ARGS]{"a": 1}g[ARGS]{"b": [1, 2]}',
        '[{"name": "s", "arguments": "{\\"k\\": 2}"}]',
    ],
    "gemma": [
        "call:get_weather{city:<escape>Paris<escape>,days:3}",
        "call:set{flag:true,ratio:0.5,name:<escape>a, b: c<escape>}",
        "call:empty{}",
    ],
    "gemma4": [
        'call:get_weather{city:<|"|>Paris<|"|>,days:3}',
        'call:set{flag:true,ratio:0.5,name:<|"|>a, b: c<|"|>}',
        "call:lst{xs:[1,2,3]}",
        'call:a{x:1}call:b{y:<|"|>two<|"|>}',
    ],
    "qwen3_coder": [
        qwen(("s", "Paris"), ("i", "3")),
        qwen(("s", "two\nlines "), ("i", "-7.0"), ("n", "2.5"), ("b", "True")),
        qwen(("n", "4.0"), ("b", "no"), ("o", '{"k": [1, {"z": null}]}'), ("a", "[1, 2]")),
        qwen(("u", '{"a": 1}'), ("e", "red"), ("s", "null")),
        qwen(("u", "42"), ("x", "[1, 'two', True, None, (3, 4.5)]"), ("t", "12")),
        qwen(("x", "{'k': 'v', 1: 2, 'f': -0.5}"), ("o", "{'py': 'dict'}")),
        qwen(("x", "plain words"), ("a", "(1,)"), ("u", "[1, 2]")),
        qwen(("unknown_param", "7"), ("s", "  spaced  ")),
        qwen(("s", "x"), name="other_tool"),
        qwen(),
        qwen(("i", "2.5")),
        qwen(("n", "abc")),
        qwen(("s", "caf\u00e9 \u4e16\u754c")),
        "<function=f>\n<parameter=s>\nunclosed\n</function>\n",
        "<function=f>\n<parameter=s>\nx\n</parameter>\n",
        "\n<function=>\n</function>\n",
        '{"name": "f", "arguments": {}}',
    ],
}


def expected(fmt, block, tools=None):
    try:
        out = (PARSERS[fmt].parse_tool_call(block, tools) if tools is not None
               else PARSERS[fmt].parse_tool_call(block))
    except Exception:
        return []
    calls = out if isinstance(out, list) else [out]
    if not all(isinstance(c, dict) and "name" in c and isinstance(c.get("arguments"), dict)
               for c in calls):
        return []
    return [{"name": c["name"], "arguments": c["arguments"]} for c in calls]


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for f, bs in CASES.items():
        for b in bs:
            tools = QWEN_TOOLS if f == "qwen3_coder" else None
            case = {"format": f, "block": b, "calls": expected(f, b, tools)}
            if tools is not None:
                case["tools"] = tools
            cases.append(case)
    (out / "tool_calls.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False))
    print(f"wrote {len(cases)} tool-call cases to {out / 'tool_calls.json'}")


if __name__ == "__main__":
    main()
