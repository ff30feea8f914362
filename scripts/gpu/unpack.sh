#!/usr/bin/env bash
# On the GPU machine, in the repo root of the working-tree copy, once every part of the bundle
# (.gpu/p1, .gpu/p2, ... made by scripts/gpu/pack.sh) has arrived: reassembles it, checks every
# checksum, installs it into $LMX_GPU_PREFIX (default /tmp/lmx, a pip --target layout: bin/,
# mlx/, mlx_cuda_13.libs/, mlx_lm/, nvidia/ -> that machine's CUDA wheels), writes
# $LMX_GPU_PREFIX/env.sh and prints `lmx --version` and an MLX GPU smoke test. See docs/gpu.md.
#   scripts/gpu/unpack.sh && . /tmp/lmx/env.sh && lmx ...
# Runs again in a later call (same warm machine) in a second: an installed bundle with the same
# checksum is kept.
# Environment: LMX_GPU_PREFIX, LMX_GPU_PYTHON (default python3), LMX_GPU_SMOKE=0 (skip the
# Python smoke test), LMX_GPU_DRYRUN=1 (on a machine without a GPU or Python 3.12: pip installs
# the cp312 wheels by tag, no Python smoke test, no links for the baked paths).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
prefix="${LMX_GPU_PREFIX:-/tmp/lmx}"
py="${LMX_GPU_PYTHON:-python3}"
dryrun="${LMX_GPU_DRYRUN:-0}"
bundle=(env -u PYTHONPATH "$py" "$root/scripts/gpu/bundle.py")
say() { echo "unpack: $*"; }
die() { echo "unpack: error: $*" >&2; exit 1; }
t0=$SECONDS

manifest="$(ls .gpu/p*/manifest.json 2>/dev/null | head -1)"
[[ -n "$manifest" ]] || die "no .gpu/p*/manifest.json here: carry .gpu/p1, .gpu/p2, ... first"
want_sha="$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["archive"]["sha256"])' "$manifest")"
meta() { "$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["meta"][sys.argv[2]])' "$manifest" "$1"; }

if [[ -f "$prefix/.bundle-sha256" && "$(cat "$prefix/.bundle-sha256")" == "$want_sha" ]]; then
  say "bundle $want_sha already installed in $prefix"
else
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/lmx-unpack.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  "${bundle[@]}" assemble .gpu "$tmp/bundle.tar.xz"
  rm -rf "$prefix.new"
  "${bundle[@]}" extract "$tmp/bundle.tar.xz" "$prefix.new"
  rm -f "$tmp/bundle.tar.xz"
  # The wheels: pip --target into a side directory, then merged (a --target install would skip
  # or replace the existing mlx/ package directory as a whole).
  pipargs=(-m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile
           --no-cache-dir --target "$tmp/pip")
  if [[ "$dryrun" == 1 ]]; then
    pipargs+=(--only-binary=:all: --python-version 3.12 --implementation cp
              --platform manylinux_2_35_x86_64)
  fi
  env -u PYTHONPATH PIP_ROOT_USER_ACTION=ignore "$py" "${pipargs[@]}" "$prefix.new"/wheels/*.whl
  cp -a "$tmp/pip/." "$prefix.new/"
  # Every file of the bundle, after the merge: also proves the wheels overwrote none of it.
  "${bundle[@]}" verify-tree "$prefix.new" "$manifest"
  rm -rf "$prefix"
  mv "$prefix.new" "$prefix"
  cp "$manifest" "$prefix/manifest.json"
  echo "$want_sha" > "$prefix/.bundle-sha256"
  say "installed in $prefix ($((SECONDS - t0)) s)"
fi

# --- this machine's CUDA libraries ------------------------------------------------------------
# libmlx.so's RPATH is $ORIGIN/../../nvidia/{cu13,cublas,cuda_nvrtc,cudnn,cufft,cusolver,nccl}/lib
# and $ORIGIN/../../mlx_cuda_13.libs: link <prefix>/nvidia/<pkg> to the nvidia-* wheels that
# python3 there holds, and put their lib dirs on LD_LIBRARY_PATH as well.
nv="$(env -u PYTHONPATH "$py" - "$prefix" <<'EOF'
import os, sys
prefix = os.path.realpath(sys.argv[1])
sys.path = [p for p in sys.path if not os.path.realpath(p or ".").startswith(prefix)]
try:
    import nvidia
    roots = [p for p in nvidia.__path__ if not os.path.realpath(p).startswith(prefix)]
except ImportError:
    roots = []
seen = set()
for r in roots:
    for sub in sorted(os.listdir(r)):
        d = os.path.join(r, sub)
        if sub not in seen and os.path.isdir(os.path.join(d, "lib")):
            seen.add(sub)
            print(sub, d)
EOF
)"
rm -rf "$prefix/nvidia"
mkdir -p "$prefix/nvidia"
libdirs=()
while read -r sub dir; do
  [[ -n "$sub" ]] || continue
  ln -s "$dir" "$prefix/nvidia/$sub"
  libdirs+=("$dir/lib")
done <<< "$nv"
if ((${#libdirs[@]})); then
  say "nvidia wheels: $(echo "$nv" | awk '{print $1}' | tr '\n' ' ')in $(dirname "$(echo "$nv" | head -1 | awk '{print $2}')")"
else
  say "warning: python3 there has no nvidia-* wheels; libmlx relies on the system's CUDA libraries"
fi
# MLX's JIT (NVRTC) needs the CUDA runtime headers: <prefix>/nvidia/cuda_runtime/include, else
# $CUDA_HOME, $CUDA_PATH, /usr/local/cuda. Pin CUDA_HOME to the first that has them.
cuda_home=""
for c in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda "$prefix/nvidia/cu13"; do
  if [[ -n "$c" && -f "$c/include/cuda_runtime.h" ]]; then cuda_home="$(cd "$c" && pwd -P)"; break; fi
done
[[ -n "$cuda_home" ]] && say "CUDA headers: $cuda_home/include" ||
  say "warning: no cuda_runtime.h found: MLX's JIT will fail (set CUDA_HOME)"
# NVRTC 13 also searches the include/ beside its own library, before --include-path. The
# nvidia-cu13 wheel's include/ has mma.h but not the crt/ it includes, so every kernel that
# includes mma.h (MLX's qmm_sm90_*) fails with `cannot open source file "crt/mma.h"`, in Python
# as in lmx (docs/gpu.md). Make <prefix>/nvidia/cu13 a directory whose lib/ is the wheel's and
# whose include/ is the toolkit's complete one.
cu13="$prefix/nvidia/cu13"
if [[ -L "$cu13" && -f "$cu13/include/mma.h" && ! -f "$cu13/include/crt/mma.h" ]]; then
  full=""
  for c in "$cuda_home/include" /usr/local/cuda/targets/x86_64-linux/include; do
    if [[ -f "$c/crt/mma.h" ]]; then full="$(cd "$c" && pwd -P)"; break; fi
  done
  if [[ -n "$full" ]]; then
    wheel="$(readlink -f "$cu13")"
    rm "$cu13" && mkdir "$cu13"
    for e in "$wheel"/*; do
      [[ "$(basename "$e")" == include ]] || ln -s "$e" "$cu13/$(basename "$e")"
    done
    ln -s "$full" "$cu13/include"
    say "NVRTC headers: $cu13/include -> $full (the wheel's lacks crt/mma.h)"
  else
    say "warning: $cu13/include lacks crt/mma.h and no complete CUDA include dir was found:" \
      "MLX's sm90 quantized kernels will not compile"
  fi
fi

cuda_line=""
[[ -n "$cuda_home" ]] && cuda_line="export CUDA_HOME=\"$cuda_home\""
ldp="$prefix/mlx/lib:$prefix/bin/lib:$prefix/mlx_cuda_13.libs"
for d in "${libdirs[@]}"; do ldp+=":$d"; done
cat > "$prefix/env.sh" <<EOF
# Written by scripts/gpu/unpack.sh: . $prefix/env.sh
export LMX_GPU_PREFIX="$prefix"
export PATH="$prefix/bin:\$PATH"
export PYTHONPATH="$prefix\${PYTHONPATH:+:\$PYTHONPATH}"
export LD_LIBRARY_PATH="$ldp\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
$cuda_line
EOF
# shellcheck disable=SC1091
. "$prefix/env.sh"

# --- the test binaries' baked paths (LMX_SOURCE_DIR, LMX_BINARY) ------------------------------
if [[ "$dryrun" != 1 ]]; then
  src="$(meta source_dir)"
  baked="$(meta lmx_binary_baked)"
  if [[ ! -e "$src" ]]; then
    mkdir -p "$(dirname "$src")" && ln -s "$root" "$src" && say "linked $src -> $root"
  fi
  if [[ ! -e "$baked" || -L "$baked" ]]; then
    mkdir -p "$(dirname "$baked")" && ln -sfn "$prefix/bin/lmx" "$baked" &&
      say "linked $baked -> $prefix/bin/lmx"
  fi
fi

# --- checks ------------------------------------------------------------------------------------
missing="$(ldd "$prefix/bin/lmx" | grep 'not found' || true)"
[[ -z "$missing" ]] || say "warning: unresolved libraries:
$missing"
say "libraries: $(ldd "$prefix/bin/lmx" |
  awk '/libmlx|cublas|cudnn|nccl|nvrtc|cufft|cusolver|cusparse|nvJitLink|libcuda\.so|pcre2|utf8proc/ {
    printf "%s%s => %s", (n++ ? ", " : ""), $1, $3}')"
lmx --version
if [[ "$dryrun" != 1 && "${LMX_GPU_SMOKE:-1}" != 0 ]]; then
  timeout 120 "$py" -c '
import mlx.core as mx, mlx_lm
a = mx.arange(64 * 64, dtype=mx.float32).reshape(64, 64) / 4096
b = (a.astype(mx.bfloat16) @ a.T.astype(mx.bfloat16)).astype(mx.float32)
ref = (a @ a.T)
mx.eval(b, ref)
print("unpack: python mlx", mx.__version__, "mlx_lm", mlx_lm.__version__, mx.default_device(),
      "cuda", mx.cuda.is_available(), "bf16 matmul max|diff|", mx.abs(b - ref).max().item())
' || say "warning: the MLX Python smoke test failed"
fi
say "done ($((SECONDS - t0)) s); next: . $prefix/env.sh"
