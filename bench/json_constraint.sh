#!/usr/bin/env bash
# Decode speed with and without a JSON-schema constraint, interleaved on the same model:
#   bench/json_constraint.sh MODEL_DIR [TRIALS]
# The schema forces a long value (an array of exactly 24 short strings), so the constrained run
# covers string, separator and end states; the unconstrained run generates the same number of
# tokens. Prints generation tok/s of both and their ratio.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
model="$1"
trials="${2:-2}"
lmx="$root/build/lmx"
schema="$(mktemp --suffix=.json)"
trap 'rm -f "$schema"' EXIT
echo '{"type":"array","items":{"type":"string","maxLength":8},"minItems":24,"maxItems":24}' >"$schema"
prompt="List many fruits."
tps() { sed -n 's/^generation: \([0-9]*\) tokens, \([0-9.]*\) tokens-per-sec/\1 \2/p'; }
for ((i = 1; i <= trials; i++)); do
  read -r n c < <("$lmx" generate --model "$model" --prompt "$prompt" --max-tokens 400 \
    --json-schema "$schema" --verbose 2>&1 >/dev/null | tps)
  read -r m u < <("$lmx" generate --model "$model" --prompt "$prompt" --max-tokens "$n" \
    --verbose 2>&1 >/dev/null | tps)
  awk -v n="$n" -v c="$c" -v m="$m" -v u="$u" 'BEGIN {
    printf "trial: constrained %d tokens %.3f tok/s, unconstrained %d tokens %.3f tok/s, ratio %.3f\n",
      n, c, m, u, c / u }'
done
