"""Training checkpoints: written atomically, the last K kept, everything needed for an exact resume.

Layout: ``<out_dir>/checkpoints/step-00000100/`` with ``drafter/`` (z-lab format, usable as a drafter
as is), ``trainer.pt`` (optimizer, scheduler, step, data position, RNG states of torch, python and
numpy) and ``config.yaml`` (the run's :class:`TrainConfig`); ``checkpoints/best.json`` names the step with the best
held-out tau, which pruning keeps besides the newest K. A checkpoint is first written into a
hidden temp folder next to it and moved into place with ``os.replace``; a write that dies half-way
leaves only a hidden temp folder, which is ignored and cleaned up by the next save.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from flashdraft.io import atomic_replace_dir, atomic_write_text
from flashdraft.train.objective import TrainError

STEP_RE = re.compile(r"^step-(\d{8})$")


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def list_checkpoints(out_dir: str | Path) -> list[Path]:
    """Complete checkpoints (oldest first); hidden temp folders of interrupted writes are skipped."""
    root = checkpoint_dir(out_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and STEP_RE.match(p.name) and (p / "trainer.pt").is_file()]
    return sorted(found, key=lambda p: int(STEP_RE.match(p.name).group(1)))


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    found = list_checkpoints(out_dir)
    return found[-1] if found else None


def save_checkpoint(
    out_dir: str | Path,
    step: int,
    drafter,
    optimizer: torch.optim.Optimizer,
    scheduler,
    data_state: dict,
    config,
    extra: dict | None = None,
) -> Path:
    """Write checkpoint ``step`` atomically (pruning is :func:`prune_checkpoints`, done after every
    variant of the step is saved)."""
    root = checkpoint_dir(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".step-*"):  # leftovers of an interrupted write
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step-{step:08d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}."))
    try:
        drafter.save_pretrained(tmp / "drafter")
        state = {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "data": data_state,
            "rng": rng_state(),
            "extra": extra or {},
        }
        torch.save(state, tmp / "trainer.pt")
        config.save(tmp / "config.yaml")
        atomic_replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def checkpoint_steps(out_dir: str | Path) -> list[int]:
    return [int(STEP_RE.match(p.name).group(1)) for p in list_checkpoints(out_dir)]


def prune_checkpoints(out_dir: str | Path, keep_last: int, protect: int | None = None) -> None:
    """Delete all but the newest ``keep_last`` checkpoints, never the step ``protect`` (the best)."""
    for old in list_checkpoints(out_dir)[:-keep_last]:
        if protect is None or int(STEP_RE.match(old.name).group(1)) != protect:
            shutil.rmtree(old, ignore_errors=True)


def read_best(out_dir: str | Path) -> dict:
    """``{"step", "tau"}`` of the best checkpoint by held-out tau so far (empty before any eval)."""
    p = checkpoint_dir(out_dir) / "best.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def write_best(out_dir: str | Path, best: dict) -> None:
    root = checkpoint_dir(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(root / "best.json", json.dumps(best) + "\n")


def load_checkpoint(path: str | Path, drafter, optimizer, scheduler) -> dict:
    """Restore drafter weights, optimizer, scheduler and RNG from ``path``; return the trainer state."""
    path = Path(path)
    if not (path / "trainer.pt").is_file():
        raise TrainError(f"{path} is not a complete training checkpoint (no trainer.pt); pick another or start afresh")
    weights = {}
    for f in sorted((path / "drafter").glob("*.safetensors")):
        weights.update(load_file(str(f)))
    try:
        drafter.load_state_dict(weights)
    except RuntimeError as e:
        raise TrainError(f"checkpoint {path} does not fit this drafter ({e}); resume with the same drafter shape") from None
    state = torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)
    try:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    except (KeyError, ValueError, TypeError) as e:  # another schedule (steps, epochs, warmup) or parameter set
        raise TrainError(f"the optimizer or scheduler state in {path} does not fit this run ({type(e).__name__}: {e}); "
                         "resume with the run's own max_steps, epochs and warmup, or start a new --out-dir with "
                         f"--set init_from={path / 'drafter'}") from None
    set_rng_state(state["rng"])
    return state


# train config field -> the drafter config attribute it shapes (a resumed drafter keeps its checkpoint's)
SHAPE_FIELDS = {"num_layers": "num_hidden_layers", "block_size": "block_size", "draft_vocab_size": "draft_vocab_size",
                "target_layer_ids": "target_layer_ids", "intermediate_size": "intermediate_size",
                "mask_token_id": "mask_token_id"}


def check_resume_shape(cfg, drafter_cfg, checkpoint: Path) -> None:
    """Refuse a resume whose config sets a drafter shape other than the checkpoint's (the weights, optimizer
    state and data position belong to that shape)."""
    diff = []
    for field, attr in SHAPE_FIELDS.items():
        want, have = getattr(cfg, field), getattr(drafter_cfg, attr, None)
        if field in cfg.model_fields_set and want not in (None, "auto") and have is not None and want != have:
            diff.append(f"{field} {want} (checkpoint: {have})")
    if diff:
        raise TrainError(f"resuming {checkpoint} with another drafter shape: {', '.join(diff)}; resume with the "
                         "checkpoint's shape (drop those settings) or train into a new --out-dir")
