"""JSON texts labelled by Python's json + jsonschema, for lmx's schema automaton.

scripts/gen_json_schema_fixtures.py OUT_DIR writes OUT_DIR/cases.json: for each schema, JSON
texts drawn from the schema, compact and with json.dumps' ", " / ": " separators (`sample`: true; lmx's automaton must accept every one) and
mutations of them (a character deleted, inserted or replaced, a truncation, a required key
dropped, an extra key, a wrong type), each with `valid` from `json.loads` (strict: no NaN) and
`jsonschema.validate`. lmx must accept no text that Python calls invalid.
"""

import argparse
import json
import random
from pathlib import Path

import jsonschema

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "age": {"type": "integer"},
            "city": {"enum": ["Paris", "London", "Berlin"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        },
        "required": ["name", "age"],
    },
    "nested": {
        "type": "object",
        "title": "annotations are ignored",
        "properties": {
            "id": {"const": 7},
            "score": {"type": "number"},
            "ok": {"type": "boolean"},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "point": {
                "type": "object",
                "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x", "y"],
            },
        },
        "required": ["id", "point"],
    },
    "tree": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
                },
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/node",
    },
    "list": {
        "type": "array",
        "items": {"type": ["string", "integer"], "minLength": 2},
        "minItems": 1,
        "maxItems": 4,
    },
    "any": {},
    "map": {"type": "object", "additionalProperties": {"type": "number"}},
    "text": {"type": "string"},
    "quoted_keys": {
        "type": "object",
        "properties": {'a"b': {"type": "null"}, "a": {"type": "null"}, "ab": {"type": "null"}},
    },
}

CHARS = list("abcXYZ 09_-") + ['"', "\\", "\n", "\t", "\u0001", "é", "ß", "日本", "🦊", "/"]


def rand_string(rng, lo=0, hi=8):
    n = rng.randint(lo, hi)
    return "".join(rng.choice(CHARS) for _ in range(n))[: max(hi, lo)] if n else ""


def resolve(schema, root):
    while "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def sample(schema, root, rng, depth=0):
    """A value of the schema in the subset lmx generates (integers as ints, short numbers)."""
    schema = resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "anyOf" in schema:
        return sample(rng.choice(schema["anyOf"]), root, rng, depth)
    t = schema.get("type")
    if isinstance(t, list):
        t = rng.choice(t)
    if t is None:
        t = rng.choice(["object", "array", "string", "integer", "number", "boolean", "null"]
                       if depth < 2 else ["string", "integer", "number", "null"])
        schema = {}
    if t == "string":
        lo, hi = schema.get("minLength", 0), schema.get("maxLength", 10)
        s = "".join(rng.choice(CHARS) for _ in range(rng.randint(lo, hi)))
        while len(s) > hi:
            s = s[:-1]
        while len(s) < lo:
            s += "a"
        return s
    if t == "integer":
        return rng.randint(-2000, 2000)
    if t == "number":
        return rng.choice([rng.randint(-50, 50), round(rng.uniform(-1e3, 1e3), 3),
                           round(rng.uniform(0, 1e-6), 9), 1.5e300])
    if t == "boolean":
        return rng.random() < 0.5
    if t == "null":
        return None
    if t == "array":
        lo, hi = schema.get("minItems", 0), schema.get("maxItems", 3)
        hi = lo if depth > 3 else hi
        return [sample(schema.get("items", {}), root, rng, depth + 1)
                for _ in range(rng.randint(lo, hi))]
    if t == "object":
        props = schema.get("properties")
        if props is None:
            value = schema.get("additionalProperties", {})
            return {rand_string(rng, 0, 5): sample(value, root, rng, depth + 1)
                    for _ in range(rng.randint(0, 3))}
        req = schema.get("required", [])
        keys = [k for k in props if k in req or rng.random() < 0.6]
        rng.shuffle(keys)
        return {k: sample(props[k], root, rng, depth + 1) for k in keys}
    raise ValueError(t)


def dumps(v):
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def mutations(text, value, rng):
    out = []
    for _ in range(6):
        i = rng.randrange(len(text) + 1)
        c = rng.choice(list('{}[]",:0-.e\\ a') + ["null", "true"])
        out += [text[:i] + c + text[i:], text[:i] + text[i + 1:], text[:i],
                text[:i] + c + text[i + 1:]]
    if isinstance(value, dict):
        for k in list(value)[:2]:
            out.append(dumps({kk: vv for kk, vv in value.items() if kk != k}))
            out.append(dumps({**value, k: [value[k]]}))
        out.append(dumps({**value, "zz": 1}))
    if isinstance(value, list) and value:
        out += [dumps(value + value + value), dumps(value[:-1]), dumps({"v": value})]
    out += [dumps(str(value)), "null", "1.0", "{}", "[]"]
    return out


def valid(schema, text):
    def no_constant(name):
        raise ValueError(name)

    try:
        value = json.loads(text, parse_constant=no_constant)
        jsonschema.validate(value, schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    args = ap.parse_args()
    rng = random.Random(1234)
    cases = []
    for name, schema in SCHEMAS.items():
        texts, seen = [], set()
        for _ in range(40):
            value = sample(schema, schema, rng)
            text = dumps(value)
            assert valid(schema, text), (name, text)
            # json.dumps' default separators put one space after ':' and ',', which lmx allows.
            spaced = json.dumps(value, ensure_ascii=False)
            candidates = [(text, True), (spaced, True)]
            candidates += [(m, False) for m in mutations(text, value, rng) + mutations(spaced, value, rng)]
            for t, is_sample in candidates:
                if t in seen:
                    continue
                seen.add(t)
                texts.append(dict(text=t, sample=is_sample, valid=is_sample or valid(schema, t)))
        cases.append(dict(name=name, schema=schema, texts=texts))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "cases.json").write_text(json.dumps(cases, ensure_ascii=False) + "\n")
    n = sum(len(c["texts"]) for c in cases)
    print(f"{n} labelled texts over {len(cases)} schemas in {args.out_dir}")


if __name__ == "__main__":
    main()
