# shellcheck shell=bash
# Sourced by the scripts: paths of the project-local MLX and a configured, built tree.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# mlx_cmake_dir [cpu|cuda]: the MLX CMake config of that backend's wheel (cpu: .venv's mlx-cpu,
# cuda: the mlx-cuda-13 wheel in .deps/mlx-cuda, installed by scripts/bootstrap.sh --cuda).
mlx_cmake_dir() {
  local d backend="${1:-cpu}"
  if [[ "$backend" == cuda ]]; then
    d="$root/.deps/mlx-cuda/mlx/share/cmake/MLX"
    [[ -f "$d/MLXConfig.cmake" ]] ||
      { echo "MLX CUDA CMake config not found: run scripts/bootstrap.sh --cuda" >&2; return 1; }
    echo "$d"; return
  fi
  d="$(ls -d "$root"/.venv/lib/python3*/site-packages/mlx/share/cmake/MLX 2>/dev/null | head -1)"
  [[ -n "$d" ]] || { echo "MLX CMake config not found under .venv: run scripts/bootstrap.sh" >&2; return 1; }
  echo "$d"
}
# build_lmx BUILD_DIR [extra cmake args...]; -DLMX_BACKEND=cuda among them selects the CUDA wheel.
build_lmx() {
  local dir="$1"; shift
  local backend=cpu a
  # A configured tree keeps its backend when the argument is left out.
  grep -q '^LMX_BACKEND:STRING=cuda$' "$dir/CMakeCache.txt" 2>/dev/null && backend=cuda
  for a in "$@"; do
    [[ "$a" == -DLMX_BACKEND=* || "$a" == -DLMX_BACKEND:STRING=* ]] && backend="${a#*=}"
  done
  local mlx_dir
  mlx_dir="$(mlx_cmake_dir "$backend")" || return 1
  local extra=()
  if [[ "$backend" == cuda ]]; then
    # MLX's config does find_dependency(CUDAToolkit): point CMake at nvcc when it is not on PATH.
    if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
      extra+=(-DCUDAToolkit_ROOT=/usr/local/cuda)
    fi
  fi
  cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DMLX_DIR="$mlx_dir" "${extra[@]}" "$@" >/dev/null
  cmake --build "$dir" -j"$(nproc)"
}
