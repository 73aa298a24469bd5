#!/usr/bin/env bash
# Debian packages dfl builds against (idempotent: installs only what is missing).
set -euo pipefail
# clang-14 + libclang-rt-14-dev (libFuzzer and the sanitizer runtimes): the fuzz build (build-fuzz)
# clang-format-14: the lint.format test (tools/format.sh --check)
# openmpi-bin + libopenmpi-dev: `mpirun -n N dfl eval` (optional for the build, tested in CI)
pkgs=(build-essential cmake pkg-config python3 python3-venv libpcre2-dev libutf8proc-dev libcjson-dev
      libmicrohttpd-dev libcurl4-openssl-dev curl clang-14 libclang-rt-14-dev clang-format-14 openmpi-bin
      libopenmpi-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[deps] installing: ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
