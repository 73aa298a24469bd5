#!/usr/bin/env bash
# The checkout must build, test and explain itself: no file of it may refer outside it (the sibling
# shared/ directory beside the checkout, absolute paths of the machine it was written on, the
# environment variable that pointed there) or cite a specification that is not in it (the design
# notes the code cites are docs/design.md). Prints each offending line; exits 1 if there is any.
#   tests/check_self_contained.sh [SOURCE_DIR]
# Each pattern has one letter in brackets so that this file does not match itself.
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"

patterns=(
  '\.\./shar[e]d'                                 # the sibling directory, as a relative path
  '"\.\.", *"shar[e]d"'                           # the same, joined by os.path.join
  'DFL_SHAR[E]D'                                  # the environment variable that pointed there
  '(^|[^[:alnum:]_.~-])/wor[k](/|$|[[:space:]])'  # an absolute path under /wor[k] (not vllm's
                                                  # v1/worker/, nor a vocabulary entry "/wor[k]")
  'SPE[C] §|SPE[C]\.md'                           # the specification outside the repository
)
args=()
for p in "${patterns[@]}"; do args+=(-e "$p"); done

# In a git checkout the tracked files and the new ones git would add (not the ignored build outputs
# and venv); otherwise every file but those.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  files() { git ls-files -z --cached --others --exclude-standard; }
else
  files() { find . \( -name .git -o -name 'build*' -o -name .venv -o -name __pycache__ \) -prune -o -type f -print0; }
fi

# Decided on the output, not on grep's status: xargs may split the list over several greps.
hits=$(files | xargs -0 grep -sInE "${args[@]}" -- || true)
if [ -n "$hits" ]; then
  echo "$hits"
  echo "check_self_contained: $(wc -l <<<"$hits") line(s) refer outside the checkout (see tests/check_self_contained.sh)" >&2
  exit 1
fi
echo "check_self_contained: $(files | tr -cd '\0' | wc -c) files, no reference outside the checkout"
