#!/usr/bin/env bash
# The Python venv for tests and tools (reference implementations, fixtures, training).
# torch==2.13.0 is installed first and alone, so pip takes the CPU build and never a CUDA one.
# Rebuilt only when tools/requirements.txt changes.
set -euo pipefail
cd "$(dirname "$0")/.."
req=tools/requirements.txt
stamp=.venv/.dfl-requirements
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
PY=${PYTHON:-python3}
echo "[venv] creating .venv from $req" >&2
rm -rf .venv
"$PY" -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check "$(grep -E '^torch==' "$req")"
.venv/bin/pip install -q --disable-pip-version-check -r "$req"
# z-lab's dflash pins an older tqdm/datasets stack it does not need for the model code: no deps.
.venv/bin/pip install -q --disable-pip-version-check --no-deps "$(grep -E '^# dflash==' "$req" | sed 's/^# //')"
echo "$want" > "$stamp"
