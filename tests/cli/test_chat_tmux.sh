#!/usr/bin/env bash
# Drives `lmx chat` in tmux on the default model (temperature 0): the answers of a two-turn
# conversation must equal `lmx generate` on the prompts transformers' apply_chat_template renders
# for the same history; /reset starts over (the first answer again); Ctrl-C stops a long answer
# and the chat goes on. TIER: exact (both sides --exact, tier L1) or default (the tier users get:
# L3 on the CPU, both sides; its kernels are deterministic, so the texts still agree).
#   tests/cli/test_chat_tmux.sh LMX_BINARY [exact|default]
#   (LMX_TEST_DATA must hold smollm2-135m-instruct-4bit)
set -euo pipefail
lmx="$1"
case "${2:-exact}" in
  exact) tier="--exact" ;;
  default) tier="" ;;
  *) echo "FAIL: TIER must be exact or default, got '$2'"; exit 2 ;;
esac
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="$root/.venv/bin/python"
model="${LMX_TEST_DATA:?}/smollm2-135m-instruct-4bit"
[[ -f "$model/config.json" ]] || { echo "FAIL: missing $model (run scripts/test.sh)"; exit 1; }
command -v tmux >/dev/null || { echo "FAIL: tmux is not installed"; exit 1; }
work="$(mktemp -d)"
session="lmx-chat-test-$$"
trap 'tmux kill-session -t "$session" 2>/dev/null || true; rm -rf "$work"' EXIT
max_tokens=24
q1="What is the capital of France?"
q2="Name one famous dish from there."

pane() { tmux capture-pane -t "$session" -p -J -S - 2>/dev/null || true; }
# Waits until the pane shows at least N '>>> ' prompts (the chat is ready for input).
wait_prompts() {
  local n="$1" t=0
  until [[ "$(pane | grep -c '^>>> ' || true)" -ge "$n" ]]; do
    sleep 0.5; t=$((t + 1))
    [[ $t -lt 240 ]] || { echo "FAIL: timed out waiting for prompt $n"; pane; exit 1; }
  done
}
start_chat() {
  tmux new-session -d -s "$session" -x 250 -y 60 \
    "'$lmx' chat $tier --model '$model' --max-tokens $1; echo '[chat exited]'; sleep 60"
}

start_chat $max_tokens
wait_prompts 1
tmux send-keys -t "$session" -l "$q1"; tmux send-keys -t "$session" Enter
wait_prompts 2
tmux send-keys -t "$session" -l "$q2"; tmux send-keys -t "$session" Enter
wait_prompts 3
tmux send-keys -t "$session" -l "/reset"; tmux send-keys -t "$session" Enter
wait_prompts 4
tmux send-keys -t "$session" -l "$q1"; tmux send-keys -t "$session" Enter
wait_prompts 5
pane > "$work/pane.txt"
tmux kill-session -t "$session"

# Answers: the lines between a '>>> question' line and the next prompt.
"$py" - "$work/pane.txt" "$work" <<'PY'
import sys, pathlib
lines = pathlib.Path(sys.argv[1]).read_text().splitlines()
prompts = [i for i, l in enumerate(lines) if l.startswith(">>> ")]
answers = ["\n".join(lines[a + 1:b]).rstrip() for a, b in zip(prompts, prompts[1:])]
# prompts: q1, q2, /reset, q1
for k, i in enumerate((0, 1, 3)):
    pathlib.Path(sys.argv[2], f"chat{k}.txt").write_text(answers[i])
PY

render() {  # render OUT_FILE JSON_MESSAGES
  "$py" - "$model" "$2" > "$1" <<'PY'
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
sys.stdout.write(tok.apply_chat_template(json.loads(sys.argv[2]), tokenize=False, add_generation_prompt=True))
PY
}
generate() { "$lmx" generate $tier --model "$model" --max-tokens $max_tokens --prompt - < "$1" | sed -e 's/[[:space:]]*$//'; }
json_str() { "$py" -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1"; }

render "$work/p1.txt" "[{\"role\": \"user\", \"content\": $(json_str "$q1")}]"
a1="$(generate "$work/p1.txt")"
render "$work/p2.txt" "[{\"role\": \"user\", \"content\": $(json_str "$q1")},
  {\"role\": \"assistant\", \"content\": $(json_str "$a1")},
  {\"role\": \"user\", \"content\": $(json_str "$q2")}]"
a2="$(generate "$work/p2.txt")"

fail=0
check() {  # check NAME WANT GOT_FILE
  local got; got="$(sed -e 's/[[:space:]]*$//' "$3")"
  if [[ "$got" == "$2" ]]; then echo "ok: $1"; else
    echo "FAIL: $1"; echo "  lmx generate: $2"; echo "  lmx chat:     $got"; fail=1; fi
}
[[ -n "$a1" && -n "$a2" ]] || { echo "FAIL: empty reference answers"; exit 1; }
check "turn 1 equals lmx generate on the rendered prompt" "$a1" "$work/chat0.txt"
check "turn 2 (cache reused) equals lmx generate on the rendered history" "$a2" "$work/chat1.txt"
check "after /reset the first answer again" "$a1" "$work/chat2.txt"

# Ctrl-C stops a long answer; the chat keeps running and answers again.
start_chat 4000
wait_prompts 1
tmux send-keys -t "$session" -l "Count from 1 to 2000, one number per line."; tmux send-keys -t "$session" Enter
t=0
until [[ "$(pane | grep -c '^[0-9]' || true)" -ge 3 ]]; do
  sleep 0.5; t=$((t + 1)); [[ $t -lt 240 ]] || { echo "FAIL: no answer streamed"; pane; exit 1; }
done
tmux send-keys -t "$session" C-c
wait_prompts 2
if pane | grep -q '\[stopped\]' && ! pane | grep -q '\[chat exited\]'; then
  echo "ok: Ctrl-C stopped the answer, the chat goes on"
else
  echo "FAIL: Ctrl-C"; pane | tail -5; fail=1
fi
tmux send-keys -t "$session" -l "/quit"; tmux send-keys -t "$session" Enter
sleep 1
pane | grep -q '\[chat exited\]' && echo "ok: /quit exits" || { echo "FAIL: /quit"; fail=1; }
if [[ $fail -eq 0 ]]; then echo "5 passed, 0 failed"; else echo "chat tmux test failed"; fi
exit $fail
