#!/usr/bin/env bash
# The main job on the embedded default target (Gemma-3-270M): decode one prompt autoregressively,
# with DFlash and with DDTree, and check that the speculative outputs are token-identical to AR.
# Usage: bash scripts/demo.sh ["prompt"] [max_new_tokens]   (DRAFTER=dir to use another drafter)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
. .venv/bin/activate
PROMPT=${1:-'def is_palindrome(s: str) -> bool:'}
NEW=${2:-48}
DRAFTER=${DRAFTER:-assets/gemma-3-270m-dflash-b8}
echo "== AR (the target alone)"
flashdraft run "$PROMPT" --method ar --max-new-tokens "$NEW"
echo "== DFlash, drafter $DRAFTER"
flashdraft run "$PROMPT" --method dflash --drafter "$DRAFTER" --max-new-tokens "$NEW" --compare-ar
echo "== DDTree, budget 32"
flashdraft run "$PROMPT" --method ddtree --drafter "$DRAFTER" --budget 32 --max-new-tokens "$NEW" --compare-ar
