#!/usr/bin/env bash
# Build dfl and run every test: the release build with the reference tests (transformers,
# tokenizers, dflash in .venv); the CUDA variant (build-cuda, -DDFL_CUDA=ON: nvcc and the CUDA 13.0
# runtime from the machine or from PyPI, scripts/setup-cuda.sh; no GPU needed to build) running the
# GPU tests (ctest -L gpu: skipped, not failed, where no GPU answers) and the CLI's --device checks
# against that binary; then an ASan+UBSan build running the unit tests, then the fuzz build (clang,
# libFuzzer) running each parser's harness for a few seconds (ctest -L fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/setup-venv.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
jobs=$(nproc)

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
echo "[test] generating fixtures (transformers save_pretrained) into build/fixtures" >&2
.venv/bin/python tools/make_fixtures.py build/fixtures

# The CUDA variant: only what its tests need (dfl and the two GPU tests), before build/'s ctest so
# that its --device checks find this build-cuda/dfl. CUDACXX names nvcc for a first configure and
# leaves a build-cuda configured before alone.
cuda_root=$(bash scripts/setup-cuda.sh)
CUDACXX="$cuda_root/bin/nvcc" cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DDFL_CUDA=ON \
  -DCUDAToolkit_ROOT="$cuda_root" -DDFL_PYTHON_TESTS=OFF -DDFL_FIXTURES_DIR="$PWD/build/fixtures" >/dev/null
cmake --build build-cuda -j"$jobs" --target dfl test_backend_ops test_cuda_forward
(cd build-cuda && ctest --output-on-failure -L gpu -j"$jobs")
DFL_BIN="$PWD/build-cuda/dfl" DFL_FIXTURES="$PWD/build/fixtures" OMP_NUM_THREADS=2 \
  .venv/bin/python tests/py/test_cli_errors.py devices

(cd build && ctest --output-on-failure -j"$jobs")

cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDFL_SANITIZE=ON -DDFL_PYTHON_TESTS=OFF \
  -DDFL_FIXTURES_DIR="$PWD/build/fixtures" >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -L unit -j"$jobs")

# libFuzzer harnesses (tests/fuzz): DFL_FUZZ_SECONDS each over a temporary copy of the seed corpus
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang-14 -DDFL_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz
(cd build-fuzz && ctest --output-on-failure -L fuzz -j"$jobs")
