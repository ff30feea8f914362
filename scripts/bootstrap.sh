#!/usr/bin/env bash
# Installs what lmx needs on a fresh Debian 12 machine, idempotently.
#   scripts/bootstrap.sh          build + runtime deps (Debian -dev packages, the mlx-cpu wheel)
#   scripts/bootstrap.sh --test   also the Python reference (mlx, mlx-lm, tokenizers, transformers)
# Everything Python goes into the project-local prefix .venv/.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
source scripts/versions.env

with_test=0
[[ "${1:-}" == "--test" ]] && with_test=1

debs=(cmake g++ pkg-config nlohmann-json3-dev libpcre2-dev libutf8proc-dev python3-venv)
((with_test)) && debs+=(libgtest-dev libgmock-dev)
missing=()
for d in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$d" 2>/dev/null | grep -q "install ok installed" || missing+=("$d")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

py="${LMX_PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
  echo "bootstrap: creating .venv"
  "$py" -m venv .venv
fi
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
want=("mlx-cpu==$MLX_VERSION")
((with_test)) && want+=("mlx==$MLX_VERSION" "mlx-lm==$MLX_LM_VERSION"
  "tokenizers==$TOKENIZERS_VERSION" "transformers==$TRANSFORMERS_VERSION" "gguf==$GGUF_VERSION"
  "numpy==$NUMPY_VERSION" "safetensors==$SAFETENSORS_VERSION" "jinja2")
need=()
for w in "${want[@]}"; do
  name="${w%%==*}"; ver="${w#*==}"
  [[ "$name" == "$ver" ]] && ver=""
  have="$(.venv/bin/python -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')"
  if [[ -z "$have" || ( -n "$ver" && "$have" != "$ver" ) ]]; then need+=("$w"); fi
done
if ((${#need[@]})); then
  echo "bootstrap: pip installing ${need[*]}"
  "${pip[@]}" "${need[@]}"
fi
