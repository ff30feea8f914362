#!/usr/bin/env python3
"""Tool-call parser fixtures for lmx serve: model outputs in each family's native format and what
mlx_lm's own tool parsers (mlx_lm.tool_parsers) make of them.

    gen_server_fixtures.py OUT_DIR   ->  OUT_DIR/tool_calls.json

Each case: {"format", "block" (the text between the format's markers), "calls": [{"name",
"arguments"}]}; calls is [] where mlx_lm's parser rejects the block (lmx then keeps it as text).
"""
import json
import sys
from pathlib import Path

from mlx_lm.tool_parsers import function_gemma, gemma4, json_tools, mistral

PARSERS = {"hermes": json_tools, "mistral": mistral, "gemma": function_gemma, "gemma4": gemma4}

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
}


def expected(fmt, block):
    try:
        out = PARSERS[fmt].parse_tool_call(block)
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
    cases = [{"format": f, "block": b, "calls": expected(f, b)} for f, bs in CASES.items() for b in bs]
    (out / "tool_calls.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False))
    print(f"wrote {len(cases)} tool-call cases to {out / 'tool_calls.json'}")


if __name__ == "__main__":
    main()
