"""Several variants from one target pass, EMA, best-by-tau checkpoints and TensorBoard logs."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from flashdraft.models.dflash import DFlashDrafter
from flashdraft.train.checkpoint import list_checkpoints, read_best
from flashdraft.train.config import TrainConfig
from flashdraft.train.loop import Trainer
from flashdraft.models import forward as forward_mod
from tests.tiny import random_prompts, tiny_target

from .test_loop import make_cfg, write_data

VARIANTS = [
    {"name": "b4", "block_size": 4, "target_layer_ids": [1, 3], "lr": 3e-3},
    {"name": "b6", "block_size": 6, "target_layer_ids": [2], "gamma": 2.0, "position_weights": "dpace",
     "feature_noise": 0.05},
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("data") / "train.jsonl")


def weights(path):
    return load_file(str(path / "model.safetensors"))


def test_variants_together_equal_each_alone_and_share_one_target_pass(tmp_path, data, monkeypatch):
    calls = []
    real = forward_mod.target_pass

    def counting(*a, **k):
        calls.append(a[2])
        return real(*a, **k)

    monkeypatch.setattr("flashdraft.train.loop.target_pass", counting)
    trainer = Trainer(make_cfg(tmp_path / "both", data, max_steps=3, variants=VARIANTS), target=tiny_target("qwen3"))
    stats_passes = len(calls)  # the feature statistics: one pass per 4 sampled sequences, union layers
    assert stats_passes == -(-min(16, len(trainer.examples)) // 4)
    both = trainer.run()
    # one pass per micro-batch, union layers
    assert len(calls) == stats_passes + 3 * 2 and all(ids == [1, 2, 3] for ids in calls)
    for v in VARIANTS:
        over = {k: val for k, val in v.items() if k != "name"}
        alone = Trainer(make_cfg(tmp_path / v["name"], data, max_steps=3, **over), target=tiny_target("qwen3")).run()
        assert both.variants[v["name"]]["losses"] == alone.losses  # bitwise-equal floats
        wa, wb = weights(both.variants[v["name"]]["final_drafter"]), weights(alone.final_drafter)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert len(calls) == 3 * (stats_passes + 6)  # each lone run paid its own target passes (and statistics)
    run = tmp_path / "both" / "run"
    assert [p.name for p in list_checkpoints(run / "b6")] == [p.name for p in list_checkpoints(run / "b4")]
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert {l.get("variant") for l in lines if l["kind"] == "train"} == {"b6", "b4"}
    assert DFlashDrafter.load_config(run / "b6" / "drafter").block_size == 6


def test_variant_kill_between_saves_resumes_from_the_common_step(tmp_path, data):
    cfg = make_cfg(tmp_path, data, max_steps=4, save_every=1, keep_last=3, variants=VARIANTS)
    full = Trainer(make_cfg(tmp_path / "ref", data, max_steps=4, save_every=1, keep_last=3, variants=VARIANTS),
                   target=tiny_target("qwen3")).run()
    Trainer(cfg, target=tiny_target("qwen3")).run(stop_after=2)
    import shutil

    shutil.rmtree(tmp_path / "run" / "b6" / "checkpoints" / "step-00000002")  # b3's save of step 2 never landed
    tr = Trainer(cfg, target=tiny_target("qwen3"))
    assert tr.step == 1
    rest = tr.run()
    for name in ("b6", "b4"):
        assert rest.variants[name]["losses"] == {k: v for k, v in full.variants[name]["losses"].items() if k > 1}


def test_bad_variant_fields_are_refused():
    with pytest.raises(ValueError, match="batch_size"):
        TrainConfig(variants=[{"name": "x", "batch_size": 4}])
    with pytest.raises(ValueError, match="names must differ"):
        TrainConfig(variants=[{"name": "x"}, {"name": "x"}])


def test_ema_is_exported_and_restored_on_resume(tmp_path, data):
    full = Trainer(make_cfg(tmp_path / "a", data, ema_decay=0.5), target=tiny_target("qwen3"))
    res = full.run()
    exported = weights(res.final_drafter)
    scale = full.variants[0].drafter.feature_scale
    for k, v in full.variants[0].ema.avg.items():
        want = v * scale[None, :] if k == "fc.weight" else v  # the feature scale is folded into fc on save
        assert torch.equal(exported[k], want), k
    raw = dict(full.drafter.named_parameters())
    assert any(not torch.equal(exported[k], raw[k].detach()) for k in full.variants[0].ema.avg)  # EMA != last weights
    Trainer(make_cfg(tmp_path / "b", data, ema_decay=0.5), target=tiny_target("qwen3")).run(stop_after=3)
    rest = Trainer(make_cfg(tmp_path / "b", data, ema_decay=0.5), target=tiny_target("qwen3")).run()
    again = weights(rest.final_drafter)
    assert all(torch.equal(again[k], exported[k]) for k in exported)


def test_best_checkpoint_by_tau_survives_pruning_and_tensorboard_logs(tmp_path, data, monkeypatch):
    taus = iter([2.5, 1.5, 1.2, 1.1, 1.0, 0.9])

    def fake_eval(target, drafter, prompts, max_new_tokens, method="dflash", budget=None):
        return {"tau": next(taus), "per_position_acceptance": [0.5, 0.2, 0.1], "rounds": 3}

    monkeypatch.setattr("flashdraft.train.loop.evaluate_tau", fake_eval)
    cfg = make_cfg(tmp_path, data, max_steps=6, eval_every=1, save_every=100, keep_last=2)
    Trainer(cfg, target=tiny_target("qwen3"), eval_prompts=random_prompts(1, 4)).run()
    assert read_best(tmp_path / "run") == {"step": 1, "tau": 2.5}
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step-00000001", "step-00000005", "step-00000006"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tmp_path / "run" / "tensorboard" / "drafter"))
    ea.Reload()
    tags = ea.Tags()["scalars"]
    assert "train/loss" in tags and "eval/eval_tau" in tags and "eval/eval_per_position_acceptance/1" in tags
    assert [e.step for e in ea.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    assert [e.value for e in ea.Scalars("eval/eval_tau")] == pytest.approx([2.5, 1.5, 1.2, 1.1, 1.0, 0.9])
