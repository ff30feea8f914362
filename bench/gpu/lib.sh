# Sourced by the GPU benchmark scripts (run.sh, families.sh).
# tag JSON: every JSON line of stdin with the fields of JSON added, other lines dropped.
tag() { python3 -c 'import json,sys
extra = json.loads(sys.argv[1])
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        d = json.loads(line); d.update(extra); print(json.dumps(d), flush=True)' "$1"; }
