#!/usr/bin/env bash
# Run one libFuzzer harness for a bounded time over a temporary copy of its seed corpus (the
# fuzzer adds inputs to its corpus directory; the committed one must stay as it is), with the
# dictionary tests/fuzz/dict/<harness>.dict when there is one (JSON syntax and field names: the
# system cJSON is not instrumented, so the fuzzer cannot learn them from coverage).
#   run_fuzz.sh FUZZER SEED_DIR ARTIFACT_DIR SECONDS RSS_MB
# Exit status: the fuzzer's (0: no crash, leak, UB, timeout or failed property). A failing input
# is left in ARTIFACT_DIR; reproduce it with: FUZZER ARTIFACT_DIR/crash-...
set -euo pipefail
fuzzer=$1 seeds=$2 artifacts=$3 seconds=$4 rss=$5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/corpus" "$artifacts"
if [ -d "$seeds" ]; then cp -r "$seeds/." "$tmp/corpus/"; fi
# -timeout: one input taking longer is a hang. Fuzz in-process, one job (the CI machine is small).
dict=()
d="$(dirname "$0")/dict/$(basename "$seeds").dict"
if [ -f "$d" ]; then dict=(-dict="$d"); fi
rc=0
"$fuzzer" "${dict[@]}" -max_total_time="$seconds" -rss_limit_mb="$rss" -timeout=10 -max_len=65536 \
  -print_final_stats=1 -artifact_prefix="$artifacts/" "$tmp/corpus" >"$tmp/log" 2>&1 || rc=$?
if [ "$rc" -eq 0 ]; then
  grep -E '^(INFO: seed corpus|#[0-9]+[[:space:]]+(INITED|DONE))|^stat::(number_of_executed_units|peak_rss_mb|new_units_added)' \
    "$tmp/log" || tail -n 5 "$tmp/log"
else
  head -c 20000 "$tmp/log"
  echo "run_fuzz: $(basename "$fuzzer") failed (exit $rc); failing input under $artifacts/" >&2
fi
exit "$rc"
