#!/usr/bin/env bash
# Creates .venv (if missing) and installs flashdraft into it. On a machine without an NVIDIA GPU the
# CPU torch wheel is pinned (constraints-cpu.txt) so pip never pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1; then
    python -m pip install -q -e ".[dev]"
else
    python -m pip install -q -c constraints-cpu.txt "torch==2.13.0"
    python -m pip install -q -c constraints-cpu.txt -e ".[dev]"
fi
