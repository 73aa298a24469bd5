#!/usr/bin/env bash
# The main job on the embedded default models: the tiny trained Qwen3.5-hybrid target and its
# DFlash drafter (models/, see their model cards) evaluated on 40 GSM8K test questions
# (data/gsm8k_test_40.jsonl), chain and DDTree-8 verification side by side: tau, per-position
# acceptance and speedup over autoregressive decoding; reports in build/run-eval/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
T=models/target
D=models/drafter
OUT=build/run-eval
./build/dfl inspect "$T"
./build/dfl inspect "$D" --target "$T"
rm -rf "$OUT"
./build/dfl eval --target "$T" --drafter "$D" --prompts data/gsm8k_test_40.jsonl --format gsm8k \
  --chat chatml --max-new 256 --tree-budget 0,4,8,16,32,64 --check-ar --out "$OUT"
echo
cat "$OUT/summary.md"
