#!/usr/bin/env bash
# Packs what the GPU machine needs to run the CUDA build into .gpu/p1, .gpu/p2, ... (git-ignored),
# each small enough to travel in one device call beside the working tree. See docs/gpu.md.
#   scripts/gpu/pack.sh [BUILD_DIR]      (default build-cuda, made by
#                                         scripts/bootstrap.sh --cuda &&
#                                         source scripts/common.sh && build_lmx build-cuda -DLMX_BACKEND=cuda)
# Environment: LMX_GPU_PART_MAX (bytes, default 48 MiB), LMX_GPU_XZ_LEVEL (default 6),
# LMX_GPU_OUT (where the parts go, default .gpu of this checkout: a helper's worktree packs into
# the checkout the device tool sends, e.g. LMX_GPU_OUT=/work/main/.gpu).
# The bundle (one tar.xz, split into parts) holds, in the layout of a pip --target directory:
#   bin/lmx, bin/lmx_tests_*        the CUDA build (RUNPATH $ORIGIN/lib:$ORIGIN/../mlx/lib)
#   bin/liblmx_ktrace.so            the CUPTI kernel tracer of bench/gpu/profile.sh
#   bin/lib/                        their non-system shared libraries (libpcre2-8, libutf8proc)
#   mlx/lib/libmlx.so, mlx/include/ mlx-cuda-13's libmlx and the headers MLX's JIT compiles with
#   mlx_cuda_13.libs/, mlx_cuda_13-*.dist-info/
#   wheels/                         mlx (cp312 frontend) and mlx-lm, installed there by unpack.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
source scripts/versions.env
build="${1:-build-cuda}"
gpu="${LMX_GPU_OUT:-$root/.gpu}"
mkdir -p "$gpu"
gpu="$(cd "$gpu" && pwd)"
limit=$((64 * 1024 * 1024))       # one device call: working tree + carried paths
margin=$((4 * 1024 * 1024))       # room for the tree to grow between packing and the calls
part_max="${LMX_GPU_PART_MAX:-$((48 * 1024 * 1024))}"
level="${LMX_GPU_XZ_LEVEL:-6}"
py="$root/.venv/bin/python"
[[ -x "$py" ]] || py=python3
die() { echo "pack: error: $*" >&2; exit 1; }

# --- the build --------------------------------------------------------------------------------
cache="$build/CMakeCache.txt"
[[ -f "$cache" ]] || die "$build is not configured: scripts/bootstrap.sh --cuda, then
  source scripts/common.sh && build_lmx $build -DLMX_BACKEND=cuda"
grep -q '^LMX_BACKEND:STRING=cuda$' "$cache" || die "$build is not a CUDA build (LMX_BACKEND)"
mlx_dir="$(sed -n 's/^MLX_DIR:[A-Z]*=//p' "$cache")"
prefix="$(cd "$mlx_dir/../../../.." && pwd)"   # <prefix>/mlx/share/cmake/MLX
[[ -f "$prefix/mlx/lib/libmlx.so" ]] || die "libmlx.so not found under $prefix"
ls -d "$prefix"/mlx_cuda_13-"$MLX_VERSION".dist-info >/dev/null 2>&1 ||
  die "$prefix does not hold mlx-cuda-13 $MLX_VERSION (scripts/versions.env)"
bins=("$build/lmx")
for t in "$build"/tests/lmx_tests_*; do [[ -x "$t" && -f "$t" ]] && bins+=("$t"); done
[[ -x "$build/lmx" ]] || die "$build/lmx not built"
for b in "${bins[@]}"; do
  [[ "$b" -nt "$prefix/mlx/lib/libmlx.so" ]] || die "$b is older than libmlx.so: rebuild"
done

# --- wheels for the Python reference there (its python3 is 3.12; mlx-lm's own dependencies,
# transformers, numpy, sentencepiece, protobuf, pyyaml, jinja2, are installed there) -----------
wheels="$gpu/wheels"
mkdir -p "$wheels"
want=("mlx==$MLX_VERSION" "mlx-lm==$MLX_LM_VERSION")
have_all=1
[[ -n "$(ls "$wheels"/mlx-"$MLX_VERSION"-cp312-*.whl 2>/dev/null)" ]] || have_all=0
[[ -n "$(ls "$wheels"/mlx_lm-"$MLX_LM_VERSION"-*.whl 2>/dev/null)" ]] || have_all=0
if ((!have_all)); then
  echo "pack: downloading ${want[*]} (cp312, manylinux x86_64)"
  "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_35_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$wheels" "${want[@]}"
fi

# --- stage ------------------------------------------------------------------------------------
stage="$gpu/stage"
rm -rf "$stage" "$gpu"/p[0-9]* "$gpu"/lmx-gpu.tar.xz
mkdir -p "$stage/bin/lib" "$stage/mlx" "$stage/wheels"
cp -p "${bins[@]}" "$stage/bin/"
# bench/gpu/profile.sh's kernel tracer (needs libcupti.so.13 there, not here).
[[ -f "$build/liblmx_ktrace.so" ]] && cp -p "$build/liblmx_ktrace.so" "$stage/bin/"
# Shared libraries the binaries need besides libmlx and the C/C++ runtime, copied under their
# sonames into bin/lib (found first through RUNPATH $ORIGIN/lib). libcuda.so.1 is the GPU
# machine's driver library (tier L3's kernels load through it), never packed.
system='^(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux-x86-64|libcuda)\.so'
for lib in $(for b in "${bins[@]}"; do readelf -d "$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; done |
             sort -u); do
  [[ "$lib" == libmlx.so || "$lib" =~ $system ]] && continue
  path="$(ldd "$build/lmx" "${bins[@]}" 2>/dev/null | awk -v l="$lib" '!f && $1 == l && $3 ~ /^\// {print $3; f = 1}')"
  [[ -n "$path" ]] || die "cannot resolve $lib here"
  cp -L "$path" "$stage/bin/lib/$lib"
done
cp -a "$prefix/mlx/lib" "$prefix/mlx/include" "$stage/mlx/"
cp -a "$prefix/mlx_cuda_13.libs" "$prefix"/mlx_cuda_13-"$MLX_VERSION".dist-info "$stage/"
cp -p "$wheels"/mlx-"$MLX_VERSION"-cp312-*.whl "$wheels"/mlx_lm-"$MLX_LM_VERSION"-*.whl "$stage/wheels/"

# --- manifest meta ----------------------------------------------------------------------------
tree_bytes="$(git ls-files -z -co --exclude-standard | "$py" -c '
import os, sys
print(sum(os.path.getsize(p) for p in sys.stdin.read().split("\0") if p and os.path.isfile(p)))')"
src_dir="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache")"
build_abs="$(cd "$build" && pwd)"
"$py" - "$gpu/meta.json" <<EOF
import json, sys, time
json.dump({
  "lmx_version": "$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$cache")",
  "mlx_version": "$MLX_VERSION", "mlx_lm_version": "$MLX_LM_VERSION",
  "git_head": "$(git rev-parse HEAD)",
  "git_dirty": $( [[ -n "$(git status --porcelain --untracked-files=no)" ]] && echo True || echo False),
  "packed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  "source_dir": "$src_dir", "build_dir": "$build_abs",
  "binaries": [$(for b in "${bins[@]}"; do printf '"%s",' "$(basename "$b")"; done)],
  "lmx_binary_baked": "$build_abs/lmx",
  "xz_level": "$level", "tree_bytes_at_pack": $tree_bytes,
}, open(sys.argv[1], "w"), indent=1)
EOF
"$py" scripts/gpu/bundle.py hash-tree "$stage" "$gpu/files.json"

# --- compress, split --------------------------------------------------------------------------
echo "pack: compressing (xz -$level)"
archive="$gpu/lmx-gpu.tar.xz"
(cd "$stage" && tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - * ) |
  xz -T0 "-$level" > "$archive"
size=$(stat -c %s "$archive")
budget=$((limit - tree_bytes - margin))
((part_max > budget)) && part_max=$budget
((part_max > 0)) || die "the working tree ($tree_bytes bytes) leaves no room in a device call"
n=$(((size + part_max - 1) / part_max))
"$py" scripts/gpu/bundle.py manifest "$gpu" "$archive" "$gpu/files.json" "$gpu/meta.json" "$n"
rm -rf "$stage" "$archive" "$gpu/files.json" "$gpu/meta.json"

echo
echo "pack: $n parts, archive $size bytes; working tree $tree_bytes bytes; per call limit $limit"
for ((i = 1; i <= n; i++)); do
  printf 'pack:   .gpu/p%d  %s bytes\n' "$i" "$(du -cb "$gpu/p$i" | tail -1 | cut -f1)"
done
echo "pack: device calls, back to back (.gpu/ lives on only while the machine stays warm, 30 s):"
for ((i = 1; i < n; i++)); do
  echo "pack:   call $i: carry [\".gpu/p$i\"]  command: scripts/gpu/preflight.sh"
done
echo "pack:   call $n: carry [\".gpu/p$n\"]  command: scripts/gpu/unpack.sh && . /tmp/lmx/env.sh && ..."
