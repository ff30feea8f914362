# Sourced by the scripts: paths of the project-local MLX and a configured, built tree.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mlx_cmake_dir() {
  local d
  d="$(ls -d "$root"/.venv/lib/python3*/site-packages/mlx/share/cmake/MLX 2>/dev/null | head -1)"
  [[ -n "$d" ]] || { echo "MLX CMake config not found under .venv: run scripts/bootstrap.sh" >&2; return 1; }
  echo "$d"
}
# build_lmx BUILD_DIR [extra cmake args...]
build_lmx() {
  local dir="$1"; shift
  cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DMLX_DIR="$(mlx_cmake_dir)" "$@" >/dev/null
  cmake --build "$dir" -j"$(nproc)"
}
