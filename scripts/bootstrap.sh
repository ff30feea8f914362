#!/usr/bin/env bash
# Installs what lmx needs on a fresh Debian 12 machine, idempotently.
#   scripts/bootstrap.sh          build + runtime deps (Debian -dev packages, the mlx-cpu wheel)
#   scripts/bootstrap.sh --test   also the Python reference (mlx, mlx-lm, tokenizers, transformers)
#   scripts/bootstrap.sh --fuzz   also clang-14 and its libFuzzer / sanitizer runtimes (bench/fuzz.sh)
#   scripts/bootstrap.sh --cuda   also the mlx-cuda-13 wheel (libmlx built for CUDA 13, its headers
#                                 and CMake config) for `build_lmx DIR -DLMX_BACKEND=cuda`
# Flags combine. Everything Python goes into the project-local prefix .venv/; the CUDA wheel goes
# alone (no dependencies: the CUDA libraries come from the toolkit) into .deps/mlx-cuda/.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
source scripts/versions.env

with_test=0
with_cuda=0
with_fuzz=0
for a in "$@"; do
  case "$a" in
    --test) with_test=1 ;;
    --cuda) with_cuda=1 ;;
    --fuzz) with_fuzz=1 ;;
    *) echo "bootstrap: unknown argument $a" >&2; exit 2 ;;
  esac
done

debs=(cmake g++ pkg-config nlohmann-json3-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev libssl-dev python3-venv)
((with_test)) && debs+=(libgtest-dev libgmock-dev tmux)
((with_fuzz)) && debs+=(clang-14 libclang-rt-14-dev)
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
# The chat page's browser test (server.chat_page_chromium) drives Debian's headless Chromium;
# best effort: without it that test reports itself skipped.
if ((with_test)) && ! command -v chromium >/dev/null; then
  echo "bootstrap: installing Debian package: chromium (for the chat page's browser test)"
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; }; } ||
    echo "bootstrap: chromium could not be installed; server.chat_page_chromium will be skipped"
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
  "numpy==$NUMPY_VERSION" "safetensors==$SAFETENSORS_VERSION" "jinja2"
  "openai" "anthropic" "jsonschema==$JSONSCHEMA_VERSION")
need=()
for w in "${want[@]}"; do
  name="${w%%==*}"; ver="${w#*==}"
  [[ "$name" == "$ver" ]] && ver=""
  have="$(.venv/bin/python -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p' || true)"
  if [[ -z "$have" || ( -n "$ver" && "$have" != "$ver" ) ]]; then need+=("$w"); fi
done
if ((${#need[@]})); then
  echo "bootstrap: pip installing ${need[*]}"
  "${pip[@]}" "${need[@]}"
fi

if ((with_cuda)); then
  # Only the C++ build uses this prefix; the CUDA toolkit itself (nvcc, cuBLAS, cuDNN, NCCL headers
  # and libraries) is not installed here: MLX's CMake config needs find_package(CUDAToolkit) and
  # cudnn.h, see docs/gpu.md.
  cuda_prefix=.deps/mlx-cuda
  have="$(ls -d "$cuda_prefix"/mlx_cuda_13-"$MLX_VERSION".dist-info 2>/dev/null || true)"
  if [[ -z "$have" ]]; then
    echo "bootstrap: pip installing mlx-cuda-13==$MLX_VERSION into $cuda_prefix"
    rm -rf "$cuda_prefix"
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-compile \
      --only-binary=:all: --target "$cuda_prefix" "mlx-cuda-13==$MLX_VERSION"
  fi
  command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
    echo "bootstrap: warning: no CUDA toolkit (nvcc) found; the CUDA build needs CUDA 13" >&2
fi
