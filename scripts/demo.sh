#!/usr/bin/env bash
# The main job on the embedded default target (Gemma-3-270M): set up .venv, then `flashdraft demo`:
# prompts -> generate -> mix report -> train -> bench decode (AR vs DFlash vs DDTree, shipped and newly
# trained drafter) -> export for vLLM -> runs/demo/report/report.html and report.md.
# Usage: bash scripts/demo.sh [flashdraft demo options]   e.g. --minutes 3, --fresh, --out runs/demo2
# A re-run skips the stages that finished (an interrupted one resumes); --fresh runs them all again.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
exec flashdraft demo "$@"
