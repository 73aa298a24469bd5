#!/bin/sh
# Measure the embedded models with dfl (and transformers for the greedy agreement check).
# Usage: tools/train/measure.sh [extra args for measure.py, e.g. --n 20]
cd "$(dirname "$0")/../.." && exec .venv/bin/python tools/train/measure.py "$@"
