#!/usr/bin/env bash
# On the GPU machine (any call, e.g. the first, that carries only .gpu/p1): what unpack.sh and
# the CUDA build rely on there, in a few lines, and the checksums of the parts already arrived.
# Changes nothing. See docs/gpu.md.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1
py="${LMX_GPU_PYTHON:-python3}"
p() { printf 'preflight: %-14s %s\n' "$1" "$2"; }
p machine "$(uname -m), $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"), $(ldd --version 2>/dev/null | head -1 | awk '{print "glibc", $NF}')"
p gpu "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2 | tr '\n' ' ')"
p libcuda "$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}') LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
p libstdc++ "$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 /{print $NF; exit}' | xargs -r strings 2>/dev/null | grep -E '^GLIBCXX_3\.4\.[0-9]+$' | sort -V | tail -1)"
p system-libs "pcre2-8: $(ldconfig -p | grep -c 'libpcre2-8.so.0 ') utf8proc: $(ldconfig -p | grep -c 'libutf8proc.so.2 ') (bundled in bin/lib anyway)"
p cuda-headers "CUDA_HOME=${CUDA_HOME:-} CUDA_PATH=${CUDA_PATH:-}; /usr/local/cuda/include/cuda_runtime.h: $([[ -f /usr/local/cuda/include/cuda_runtime.h ]] && echo yes || echo no); nvcc: $(nvcc --version 2>/dev/null | tail -2 | head -1)"
p python "$(command -v "$py") $("$py" --version 2>&1)"
env -u PYTHONPATH "$py" - <<'EOF'
import importlib.metadata as md, os
def v(n):
    try: return md.version(n)
    except Exception: return "-"
names = ["numpy", "transformers", "sentencepiece", "protobuf", "pyyaml", "jinja2", "safetensors",
         "mlx", "mlx-lm", "nvidia-cublas", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime",
         "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cufft", "nvidia-cusolver"]
print("preflight: packages     " + " ".join(f"{n}={v(n)}" for n in names))
try:
    import nvidia
    for r in nvidia.__path__:
        subs = sorted(s for s in os.listdir(r) if os.path.isdir(os.path.join(r, s, "lib")))
        inc = os.path.isfile(os.path.join(r, "cu13", "include", "cuda_runtime.h"))
        print(f"preflight: nvidia         {r}: {' '.join(subs)}; cu13/include/cuda_runtime.h: {inc}")
except ImportError:
    print("preflight: nvidia         no nvidia-* wheels")
EOF
p disk "$(df -h /tmp | awk 'NR==2{print $4 " free in /tmp"}')"
p repo "$root"
if ls .gpu/p*/manifest.json >/dev/null 2>&1; then
  env -u PYTHONPATH "$py" - <<'EOF'
import glob, hashlib, json, os
m = json.load(open(sorted(glob.glob(".gpu/p*/manifest.json"))[0]))
for p in m["parts"]:
    path = os.path.join(".gpu", p["path"])
    if not os.path.isfile(path):
        print(f"preflight: part           {p['path']}: not here yet")
        continue
    h = hashlib.sha256(open(path, "rb").read()).hexdigest()
    print(f"preflight: part           {p['path']}: {'ok' if h == p['sha256'] else 'CHECKSUM DIFFERS'}")
EOF
else
  p part "no .gpu/p*/manifest.json here"
fi
