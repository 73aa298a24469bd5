#!/usr/bin/env bash
# The main job on the embedded default models: the tiny trained Qwen3.5-hybrid target and its
# DFlash drafter (models/, see their model cards) evaluated on 40 GSM8K test questions
# (data/gsm8k_test_40.jsonl), chain and DDTree-8 verification side by side: tau, per-position
# acceptance and speedup over autoregressive decoding; reports in build/run-eval/. Ends with the
# elapsed time of the evaluation and the threads it used (OMP_NUM_THREADS, default: every core).
set -euo pipefail
start=$(date +%s.%N)
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
t0=$(date +%s.%N)
./build/dfl eval --target "$T" --drafter "$D" --prompts data/gsm8k_test_40.jsonl --format gsm8k \
  --chat chatml --max-new 256 --tree-budget 0,4,8,16,32,64 --check-ar --out "$OUT"
t1=$(date +%s.%N)
echo
cat "$OUT/summary.md"
# the threads the run used, as dfl recorded them (summary.json "run"), and where they came from
threads=$(grep -o '"threads": [0-9]*' "$OUT/summary.json" | head -n1 | grep -o '[0-9]*$' || true)
if [ -n "${OMP_NUM_THREADS:-}" ]; then
  src="OMP_NUM_THREADS=$OMP_NUM_THREADS"
else
  mean=$(grep -o '"threads_mean": [0-9.]*' "$OUT/summary.json" | head -n1 | grep -o '[0-9.]*$' || true)
  src="the default: every core, nproc = $(nproc), adaptive: ${mean:-?} on average (docs/threads.md); set OMP_NUM_THREADS=N to fix it"
fi
echo
awk -v a="$t0" -v b="$t1" -v s="$start" -v e="$(date +%s.%N)" -v n="${threads:-?}" -v src="$src" 'BEGIN {
  printf "run.sh: dfl eval took %.1f s (the whole script %.1f s, build and inspect included) on %s threads (%s)\n",
    b - a, e - s, n, src }'
