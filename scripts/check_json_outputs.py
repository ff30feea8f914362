"""Checks constrained-decoding outputs with Python's json and jsonschema (used by lmx's tests).

scripts/check_json_outputs.py FILE: FILE holds one JSON object per line, {"schema": S, "output":
TEXT} (S null: any JSON object). Each output must parse (strict: no NaN / Infinity) and validate.
Prints one line per failure and exits 1 if there was any.
"""

import json
import sys

import jsonschema


def no_constant(name):
    raise ValueError(f"non-standard constant {name}")


def main():
    failures = 0
    lines = open(sys.argv[1], encoding="utf-8").read().splitlines()
    for i, line in enumerate(lines):
        case = json.loads(line)
        try:
            value = json.loads(case["output"], parse_constant=no_constant)
            if case["schema"] is None:
                assert isinstance(value, dict), "not an object"
            else:
                jsonschema.validate(value, case["schema"])
        except (ValueError, AssertionError, jsonschema.ValidationError) as e:
            failures += 1
            print(f"case {i}: {type(e).__name__}: {str(e)[:200]} in {case['output']!r}")
    print(f"{len(lines) - failures} of {len(lines)} outputs parse and validate")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
