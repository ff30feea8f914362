#!/usr/bin/env bash
# GPU machine, after scripts/gpu/unpack.sh: LoRA training speed and memory of `lmx lora --train`
# against `mlx_lm.lora --train` (bench/train_cpu.py: same data, flags and seed, each with and
# without --grad-checkpoint) on random Qwen3 weights in real shapes, 4-bit group 64
# (bench/gpu/prepare.sh hf + mlx). Tables and JSON lines land in $OUT.
#   MODELS=qwen3-0.6b bench/gpu/train.sh [train_cpu.py flags...]
# Both compile their training step; --uncompiled adds lmx with MLX_DISABLE_COMPILE=1 (and
# --mlx-lm-uncompiled mlx-lm so) to the same run. Each configuration first trains 2 steps
# unmeasured (JIT kernels; --no-warmup skips it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck disable=SC1091
. /tmp/lmx/env.sh
export MODELS="${MODELS:-qwen3-0.6b}" MLX_GROUPS=64 W="${W:-/tmp/gpubench}"
out="${OUT:-$W/out}"
mkdir -p "$out"
# prepare.sh's status is its last marker test; the markers say whether the steps worked
bash "$here/prepare.sh" hf mlx || true
[[ -e "$W/done.mlx" ]] || { echo "train.sh: preparing the models failed ($W/logs)" >&2; exit 1; }
for m in ${MODELS//,/ }; do
  python3 "$root/bench/train_cpu.py" --model "$W/mlx/$m-4bit-g64" --lmx /tmp/lmx/bin/lmx \
    --jsonl "$out/train-$m.jsonl" "$@" | tee "$out/train-$m.md"
done
