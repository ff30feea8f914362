#!/usr/bin/env bash
# Acceptance of a DFlash drafter (or any --draft-model) on held-out text, measured with lmx:
#   eval_dflash.sh MODEL DRAFTER TEXT_FILE [PROMPTS=8] [MAX_TOKENS=64] [K]
# Cuts PROMPTS windows of 400 characters at evenly spaced offsets of TEXT_FILE, runs greedy
# `lmx generate --draft-model DRAFTER --verbose` on each, and sums the speculative line:
# rounds, drafted, accepted, and the mean accepted length (tokens per target forward).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model="$1" drafter="$2" text="$3" n="${4:-8}" max="${5:-64}" k="${6:-}"
lmx="${LMX:-$root/build/lmx}"
size=$(wc -c <"$text")
rounds=0 drafted=0 accepted=0
for ((i = 0; i < n; i++)); do
  off=$(((size - 400) * i / n))
  prompt=$(tail -c +"$((off + 1))" "$text" | head -c 400)
  args=(generate --model "$model" --draft-model "$drafter" --prompt "$prompt"
        --max-tokens "$max" --verbose)
  [[ -n "$k" ]] && args+=(--num-draft-tokens "$k")
  line=$("$lmx" "${args[@]}" 2>&1 >/dev/null | grep '^speculative')
  read -r r d a < <(sed -E 's/.*: ([0-9]+) rounds, ([0-9]+) drafted, ([0-9]+) accepted.*/\1 \2 \3/' <<<"$line")
  echo "prompt $i (offset $off): $r rounds, $d drafted, $a accepted"
  rounds=$((rounds + r)) drafted=$((drafted + d)) accepted=$((accepted + a))
done
awk -v r="$rounds" -v d="$drafted" -v a="$accepted" 'BEGIN {
  printf "total: %d rounds, %d drafted, %d accepted (%.1f%%), mean accepted length %.2f\n",
         r, d, a, 100 * a / d, (a + r) / r }'
