"""The demo's stage runner: markers, skip on re-run, --fresh, resume after an interrupted stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashdraft.demo.stages import Stage, StageError, marker_path, read_marker, run_stages
from flashdraft.models.drafter import DrafterError


class Counting:
    """Stages that count their calls; ``interrupt_at`` raises KeyboardInterrupt once, half-way through a stage
    that keeps its own progress file (as generate and train do), so the rerun continues from that progress."""

    def __init__(self, tmp_path, interrupt_at: str | None = None):
        self.calls: dict[str, int] = {}
        self.interrupt_at = interrupt_at
        self.tmp = tmp_path

    def stage(self, name: str) -> Stage:
        def run(ctx):
            self.calls[name] = self.calls.get(name, 0) + 1
            progress = ctx["out"] / f"{name}.progress"
            done = int(progress.read_text()) if progress.is_file() else 0
            for item in range(done, 4):  # 4 items of work, each saved when finished
                if name == self.interrupt_at and item == 2:
                    self.interrupt_at = None
                    raise KeyboardInterrupt
                progress.write_text(str(item + 1))
            prev = [ctx["outputs"][s]["file"] for s in ctx["outputs"]]  # earlier stages' outputs are visible
            (ctx["out"] / f"{name}.txt").write_text(",".join(prev))
            return {"file": str(ctx["out"] / f"{name}.txt"), "resumed_from": done}

        return Stage(name, f"stage {name}", run, outputs=(f"{name}.progress", f"{name}.txt"))

    def stages(self) -> list[Stage]:
        return [self.stage(n) for n in ("a", "b", "c")]


def test_markers_then_skip_then_fresh(tmp_path):
    c = Counting(tmp_path)
    said: list[str] = []
    m = run_stages(c.stages(), tmp_path, say=said.append)
    assert c.calls == {"a": 1, "b": 1, "c": 1}
    assert json.loads(marker_path(tmp_path, "b").read_text())["outputs"]["file"] == str(tmp_path / "b.txt")
    assert (tmp_path / "c.txt").read_text() == f"{tmp_path / 'a.txt'},{tmp_path / 'b.txt'}"
    assert m["c"]["minutes"] >= 0 and m["c"]["finished"]
    run_stages(c.stages(), tmp_path, say=said.append)  # every stage finished: nothing runs again
    assert c.calls == {"a": 1, "b": 1, "c": 1}
    assert sum("skipped" in s for s in said) == 3
    (tmp_path / "keep.txt").write_text("not a stage's")
    m = run_stages(c.stages(), tmp_path, fresh=True, say=said.append)
    assert c.calls == {"a": 2, "b": 2, "c": 2}
    assert all(m[s]["outputs"]["resumed_from"] == 0 for s in "abc")  # fresh: from nothing, not from old progress
    assert (tmp_path / "keep.txt").is_file()  # only the stages' own outputs go


def test_interrupted_stage_resumes_without_redoing_finished_ones(tmp_path):
    c = Counting(tmp_path, interrupt_at="b")
    with pytest.raises(KeyboardInterrupt):
        run_stages(c.stages(), tmp_path, say=lambda s: None)
    assert read_marker(tmp_path, "a") is not None
    assert read_marker(tmp_path, "b") is None and read_marker(tmp_path, "c") is None  # no marker for a cut stage
    m = run_stages(c.stages(), tmp_path, say=lambda s: None)
    assert c.calls == {"a": 1, "b": 2, "c": 1}  # a not redone; b rerun once; c run once
    assert m["b"]["outputs"]["resumed_from"] == 2  # b continued from its own progress, not from the start
    assert m["c"]["outputs"]["resumed_from"] == 0


def test_bad_marker_and_duplicate_names(tmp_path):
    c = Counting(tmp_path)
    p = marker_path(tmp_path, "a")
    p.parent.mkdir(parents=True)
    p.write_text("{not json")
    with pytest.raises(StageError, match="delete it"):
        run_stages(c.stages(), tmp_path, say=lambda s: None)
    with pytest.raises(StageError, match="repeat"):
        run_stages([c.stage("a"), c.stage("a")], tmp_path, fresh=True, say=lambda s: None)


def test_fine_tuning_uses_its_own_learning_rate_and_block_size(tmp_path):
    """A fine-tune starts from a trained drafter: the recipe's fresh-drafter lr would wipe it out, and its block
    size would retrain the drafter at another one."""
    from flashdraft.demo.pipeline import DemoConfig, train_sets
    from flashdraft.train.config import TrainConfig

    ft = DemoConfig()
    assert ft.shipped == "assets/gemma-3-270m-dflash" and DemoConfig(target="smollm2-135m-instruct").shipped is None
    shipped = json.loads((Path(ft.shipped) / "config.json").read_text())
    own = shipped["block_size"]
    assert train_sets(ft)[-2:] == [f"lr={ft.fine_tune_lr}", f"block_size={own}"]
    loaded = TrainConfig.load(ft.recipe, sets=train_sets(ft))
    assert (loaded.lr, loaded.block_size) == (ft.fine_tune_lr, own)
    (tmp_path / "config.json").write_text(json.dumps({**shipped, "block_size": 5}))
    assert train_sets(DemoConfig(init_from=str(tmp_path)))[-1] == "block_size=5"
    with pytest.raises(DrafterError, match="config.json not found"):  # not a drafter folder: said before training
        train_sets(DemoConfig(init_from=str(tmp_path / "none")))
    assert not any(s.startswith(("lr=", "block_size=")) for s in train_sets(DemoConfig(fine_tune=False)))  # fresh: the recipe's
    assert train_sets(DemoConfig(train_set=["lr=1e-3", "block_size=8"])) == ["lr=1e-3", "block_size=8"]  # the user's win
