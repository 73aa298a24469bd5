#!/usr/bin/env bash
# Format dfl's C, CUDA and header files as .clang-format says (clang-format 14), in place; with
# --check, change nothing and list the files that differ (exit 1). The lint.format test runs
# --check.
#   tools/format.sh [--check] [SOURCE_DIR]
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,5p' "$0"; exit 0; }
check=0
[[ ${1:-} == --check ]] && { check=1; shift; }
[[ ${1:-} == -* ]] && { echo "tools/format.sh: unknown option $1 (tools/format.sh --help)" >&2; exit 2; }
cd "${1:-$(dirname "$0")/..}"
cf=$(command -v clang-format-14 || command -v clang-format || true)
[[ -n $cf ]] || { echo "clang-format-14 not found (Debian: apt-get install clang-format-14)" >&2; exit 77; }
# the tracked files and the new ones git would add; outside a git checkout, every such file but the
# build outputs
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -d '' files < <(git ls-files -z --cached --others --exclude-standard -- \
    'src/*.c' 'src/*.h' 'src/*.cu' 'include/*.h' 'tests/*.c' 'tests/*.h' 'tests/*.cu' 'python/*.c')
else
  mapfile -d '' files < <(find src include tests python \( -name 'build*' -o -name .venv \) -prune -o \
    -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) -print0 2>/dev/null)
fi
if ((check)); then
  bad=0
  for f in "${files[@]}"; do
    "$cf" --dry-run --Werror "$f" >/dev/null 2>&1 || { echo "not formatted: $f (tools/format.sh)"; bad=1; }
  done
  exit $bad
fi
"$cf" -i "${files[@]}"
python3 tools/fix_comment_continuations.py "${files[@]}"
