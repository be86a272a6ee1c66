"""``flashdraft serve-cmd``: the exact vLLM and SGLang commands that serve an exported drafter.

Target-side facts (vLLM 0.32): the native Gemma-3 class does not hand intermediate hidden states
to a drafter, so such targets run with ``--model-impl transformers``; drafters mixing sliding and
full layers need the V2 model runner. The vLLM ``--speculative-config`` (method and
``num_speculative_tokens``) is the one the exporter wrote into the folder's manifest (``dflash``
with block_size - 1, which vLLM does not read from the file; ``eagle3`` with the drafter's chain
depth); a folder without a manifest is taken for DFlash. SGLang counts the whole block
(``--speculative-num-draft-tokens`` = block_size).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from flashdraft.export.formats import MANIFEST

# HF model_type of targets whose native vLLM class lacks the aux-hidden-state interface.
VLLM_NATIVE_WITHOUT_AUX = {"gemma3_text", "gemma3"}


def _read(drafter_dir: Path) -> tuple[dict, dict]:
    cfg = json.loads((drafter_dir / "config.json").read_text())
    m = drafter_dir / MANIFEST
    return cfg, (json.loads(m.read_text()) if m.is_file() else {})


def serve_warnings(drafter_dir: str | Path) -> list[str]:
    """What the printed commands cannot promise for this folder: one not written by ``flashdraft export`` is
    taken for z-lab format, which a flashdraft drafter with a reduced draft vocabulary is not."""
    d = Path(drafter_dir)
    cfg, manifest = _read(d)
    if manifest:
        return []
    out = [f"{d} was not written by `flashdraft export` (no {MANIFEST}): the commands below take it for z-lab format; "
           f"export it first (flashdraft export {d} --to vllm -o OUT, or --to sglang)"]
    if cfg.get("draft_vocab_size") and cfg.get("draft_vocab_size") != cfg.get("vocab_size"):
        out.append(f"its draft vocabulary ({cfg['draft_vocab_size']} of {cfg.get('vocab_size')} ids) is one SGLang "
                   "and the z-lab code cannot load; `flashdraft export --to vllm` writes it as vLLM reads it")
    return out


def serve_commands(drafter_dir: str | Path, target: str, target_family: str | None = None, port: int = 8000,
                   dtype: str = "bfloat16") -> dict[str, str]:
    """{"vllm": ..., "vllm_baseline": ..., "sglang": ...} for an exported drafter folder (a key is absent
    when the folder's format is not served by that engine)."""
    d = Path(drafter_dir).resolve()
    cfg, manifest = _read(d)
    fmt = manifest.get("format") or ("speculators" if "speculators_model_type" in cfg else "zlab")
    family = target_family or (manifest.get("quirks") or {}).get("family")
    block = cfg.get("block_size", 16)
    layer_types = (cfg.get("transformer_layer_config") or cfg).get("layer_types") or []
    env = "VLLM_USE_V2_MODEL_RUNNER=1 " if {"sliding_attention", "full_attention"} <= set(layer_types) else ""
    impl = " --model-impl transformers" if family in VLLM_NATIVE_WITHOUT_AUX else ""
    base = f"vllm serve {shlex.quote(target)} --dtype {dtype}{impl}"
    out = {"vllm_baseline": f"{base} --port {port}"}
    if fmt in ("vllm", "speculators"):
        sc = manifest.get("speculative_config") or {"method": "dflash", "num_speculative_tokens": block - 1}
        spec = json.dumps({"method": sc["method"], "model": str(d), **{k: v for k, v in sc.items() if k != "method"}})
        out["vllm"] = f"{env}{base} --port {port + 1} --speculative-config {shlex.quote(spec)}"
    if fmt == "speculators":
        out["vllm_speculators"] = f"{env}vllm serve {shlex.quote(str(d))} --dtype {dtype}{impl} --port {port + 1}"
    if fmt in ("sglang", "zlab"):
        out["sglang"] = (f"python -m sglang.launch_server --model-path {shlex.quote(target)} --dtype {dtype} "
                         f"--speculative-algorithm DFLASH --speculative-draft-model-path {shlex.quote(str(d))} "
                         f"--speculative-num-draft-tokens {block} --trust-remote-code --port {port + 2}")
    return out
