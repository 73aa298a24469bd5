#!/usr/bin/env bash
# The main job on the embedded default models.
# Until the trained embedded pair (models/) lands, this builds dfl, generates the small
# random-weight fixtures with transformers, and runs `dfl inspect` and greedy + speculative
# generation on the Qwen3.5 (VLM-layout) fixture and its DFlash drafter.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
bash scripts/setup-venv.sh
.venv/bin/python tools/make_fixtures.py build/fixtures >/dev/null
T=build/fixtures/qwen35_vlm
D=build/fixtures/dflash_qwen35
./build/dfl inspect "$T"
./build/dfl inspect "$D" --target "$T"
echo "--- greedy:"
./build/dfl generate --target "$T" --prompt "Natalia sold clips to 48 of her friends" --max-new 32
echo "--- speculative (DFlash, block 16; a random-weight drafter accepts almost nothing):"
./build/dfl generate --target "$T" --drafter "$D" --prompt "Natalia sold clips to 48 of her friends" --max-new 32
