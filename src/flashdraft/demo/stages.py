"""A resumable chain of stages: each one that finishes leaves a marker; a re-run skips marked stages.

A marker is ``<out>/stages/<name>.json`` ({"stage", "outputs", "minutes", "finished"}), written
atomically after the stage function returned, so a stage interrupted part-way (Ctrl-C, a crash)
has no marker and runs again on the next call, through its own resume (generate and train pick up
where they stopped). ``fresh=True`` drops every marker and every stage's own outputs (``Stage.outputs``,
paths under the run folder) first and runs the whole chain again from nothing.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flashdraft.errors import FlashdraftError
from flashdraft.io import atomic_write_text


class StageError(FlashdraftError, RuntimeError):
    """A stage that cannot run (a missing input from an earlier stage, a bad marker)."""


@dataclass(frozen=True)
class Stage:
    """``run(ctx)`` does the work and returns ``{output name: path or figure}``, recorded in the marker."""

    name: str
    what: str  # one line printed before the stage starts
    run: Callable[[dict], dict]
    outputs: tuple[str, ...] = ()  # files / folders under the run folder the stage writes (and resumes from)


def marker_path(out: Path, name: str) -> Path:
    return Path(out) / "stages" / f"{name}.json"


def read_marker(out: Path, name: str) -> dict | None:
    """The marker of a finished stage, or None when the stage has not finished."""
    p = marker_path(out, name)
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise StageError(f"stage marker {p} is unreadable ({e}); delete it to run the stage '{name}' again") from None


def write_marker(out: Path, name: str, outputs: dict, minutes: float) -> Path:
    p = marker_path(out, name)
    p.parent.mkdir(parents=True, exist_ok=True)
    rec = dict(stage=name, outputs=outputs, minutes=minutes, finished=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    atomic_write_text(p, json.dumps(rec, indent=1, default=str) + "\n")
    return p


def run_stages(stages: list[Stage], out: Path, fresh: bool = False, say: Callable[[str], None] = print) -> dict:
    """Run ``stages`` in order; return {stage name: marker}. Each stage sees ``ctx``: {"out": out,
    "outputs": {earlier stage: its outputs}}. A KeyboardInterrupt leaves the interrupted stage unmarked."""
    out = Path(out)
    if len({s.name for s in stages}) != len(stages):
        raise StageError(f"stage names repeat: {[s.name for s in stages]}; give each stage its own name")
    if fresh:
        for s in stages:
            marker_path(out, s.name).unlink(missing_ok=True)
            for rel in s.outputs:  # or the stage would resume from them and redo nothing
                p = out / rel
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink(missing_ok=True)
    markers: dict[str, dict] = {}
    ctx: dict = {"out": out, "outputs": {}}
    for i, s in enumerate(stages, 1):
        head = f"[{i}/{len(stages)}] {s.name}"
        done = read_marker(out, s.name)
        if done is not None:
            say(f"{head}: finished earlier ({done['finished']}, {done['minutes']:.1f} min); skipped "
                f"(--fresh runs it again) -> {marker_path(out, s.name)}")
        else:
            say(f"{head}: {s.what}")
            t0 = time.perf_counter()
            outputs = s.run(ctx)
            minutes = (time.perf_counter() - t0) / 60
            write_marker(out, s.name, outputs, minutes)
            done = read_marker(out, s.name)
            where = ", ".join(f"{k}: {v}" for k, v in outputs.items())
            say(f"{head}: done in {minutes:.1f} min -> {where}")
        markers[s.name] = done
        ctx["outputs"][s.name] = done["outputs"]
    return markers
