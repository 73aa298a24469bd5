#!/usr/bin/env bash
# The CUDA toolkit for the CUDA variant (cmake -DDFL_CUDA=ON): nvcc, the runtime headers and the
# static runtime of CUDA 13.0, the release the device machines' driver runs. Prints the toolkit
# root to use on stdout (nvcc at ROOT/bin/nvcc); what it does goes to stderr:
#
#   root=$(bash scripts/setup-cuda.sh)
#   cmake -S . -B build-cuda -DDFL_CUDA=ON -DCUDAToolkit_ROOT="$root" -DCMAKE_CUDA_COMPILER="$root/bin/nvcc"
#
# A toolkit already there is used when it is CUDA 13.0 with what the build needs (bin/nvcc,
# include/cuda_runtime.h, lib64/libcudart_static.a, lib64/libcudart.so): $DFL_CUDA_ROOT,
# $CUDAToolkit_ROOT, $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, the nvcc on PATH. Otherwise the
# pinned wheels of PyPI (the nvidia-cuda-* packages below) are pip-installed into .venv, where they
# land in site-packages/nvidia/cu13/{bin,include,lib,nvvm}; the two links a toolkit has and the
# wheels lack are added there (lib64 -> lib: nvcc links from ROOT/lib64; libcudart.so: CMake's
# FindCUDAToolkit requires it though dfl links libcudart_static.a). No GPU or driver is needed to
# build; the binary says "no usable GPU" where none answers.
#
# DFL_CUDA_PYPI=1 skips the toolkits already there (the PyPI route, as on a bare CI machine);
# DFL_CUDA_VENV=DIR installs into another venv than .venv (made if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

release=13.0
wheels=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88
        nvidia-cuda-cccl==13.0.85 nvidia-nvvm==13.0.88)

usable() { # a CUDA $release toolkit with what the build needs at root $1
    local r=$1
    [ -n "$r" ] && [ -x "$r/bin/nvcc" ] && [ -f "$r/include/cuda_runtime.h" ] &&
        [ -f "$r/lib64/libcudart_static.a" ] && [ -e "$r/lib64/libcudart.so" ] &&
        "$r/bin/nvcc" --version 2>/dev/null | grep -q "release $release,"
}

nvcc_root=""
candidates=()
if [ "${DFL_CUDA_PYPI:-0}" != 1 ] && command -v nvcc >/dev/null 2>&1; then
    # through wrappers (/usr/local/bin/nvcc may be a script exec'ing the real one): ask nvcc itself
    nvcc_root=$({ nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 || true; } | sed -n 's/^#\$ TOP=//p' | head -1)
    if [ -n "$nvcc_root" ]; then nvcc_root=$(readlink -f "$nvcc_root" || true)
    else nvcc_root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); fi
fi
[ "${DFL_CUDA_PYPI:-0}" = 1 ] ||
    candidates=("${DFL_CUDA_ROOT:-}" "${CUDAToolkit_ROOT:-}" "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda "$nvcc_root")
for r in ${candidates[@]+"${candidates[@]}"}; do
    if usable "$r"; then
        echo "[cuda] CUDA $release toolkit at $r" >&2
        echo "$r"
        exit 0
    fi
done

# PyPI: into the repository's venv (scripts/setup-venv.sh makes it; a rebuilt venv gets them again)
venv=${DFL_CUDA_VENV:-.venv}
if [ ! -x "$venv/bin/pip" ]; then
    if [ "$venv" = .venv ]; then bash scripts/setup-venv.sh >&2; else "${PYTHON:-python3}" -m venv "$venv"; fi
fi
venv_root() {
    "$venv/bin/python" - <<'EOF'
import importlib.util, os
spec = importlib.util.find_spec("nvidia")
roots = [os.path.join(p, "cu13") for p in (spec.submodule_search_locations or [])] if spec else []
print(next((r for r in roots if os.path.isfile(os.path.join(r, "bin", "nvcc"))), ""))
EOF
}
links() { # what a toolkit has and the wheels lack
    [ -e "$root/lib64" ] || ln -s lib "$root/lib64"
    [ -e "$root/lib/libcudart.so" ] || ln -s libcudart.so.13 "$root/lib/libcudart.so"
}
root=$(venv_root)
[ -z "$root" ] || links
if ! usable "$root"; then
    echo "[cuda] no CUDA $release toolkit found: pip-installing ${wheels[*]} into $venv" >&2
    # a wrong release or a damaged tree there: installed again over it
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps ${root:+--force-reinstall} "${wheels[@]}" >&2
    root=$(venv_root)
    [ -n "$root" ] || { echo "[cuda] no nvidia/cu13/bin/nvcc in $venv after installing ${wheels[*]}" >&2; exit 1; }
    links
    if ! usable "$root"; then
        echo "[cuda] $root: not a usable CUDA $release toolkit after installing ${wheels[*]}" >&2
        exit 1
    fi
fi
echo "[cuda] CUDA $release toolkit at $root (PyPI wheels in $venv)" >&2
echo "$root"
