"""The loop on a tiny target: exact resume, atomic checkpoints, signals, export, eval, skipped sequences."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from flashdraft.decode import build_decoder
from flashdraft.models.dflash import DFlashDrafter
from flashdraft.models.drafter import load_drafter
from flashdraft.train import checkpoint as ckpt_mod
from flashdraft.train.checkpoint import latest_checkpoint, list_checkpoints
from flashdraft.train.config import TrainConfig
from flashdraft.train.loop import Trainer
from flashdraft.train.objective import TrainError
from tests.tiny import MASK_ID, hf_greedy, random_prompts, tiny_target


def write_data(path, n=6, seed=0, short=2):
    """Token-level records: a random prompt + the tiny target's greedy continuation (loss on the latter)."""
    target = tiny_target("qwen3")
    with open(path, "w") as f:
        for i, p in enumerate(random_prompts(n, 6, seed=seed)):
            resp = hf_greedy(target, p, 18)
            f.write(json.dumps({"token_ids": p + resp, "loss_mask": [0] * len(p) + [1] * len(resp)}) + "\n")
        for _ in range(short):
            f.write(json.dumps({"token_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}) + "\n")
    return path


def make_cfg(tmp_path, data, **kw):
    base = dict(
        target="tiny", data=[str(data)], out_dir=str(tmp_path / "run"), num_layers=1, block_size=4,
        target_layer_ids=[1, 3], mask_token_id=MASK_ID, max_len=64, max_anchors=4, batch_size=2, grad_accum=2,
        max_steps=6, lr=3e-3, warmup_ratio=0.2, save_every=2, keep_last=2, progress=False, feature_noise=0.01,
    )
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("data") / "train.jsonl")


def test_kill_and_resume_gives_the_same_losses(tmp_path, data):
    full = Trainer(make_cfg(tmp_path / "a", data), target=tiny_target("qwen3")).run()
    assert full.stopped == "done" and len(full.losses) == 6
    part = Trainer(make_cfg(tmp_path / "b", data), target=tiny_target("qwen3")).run(stop_after=3)
    assert part.stopped == "stop_after" and part.step == 3
    rest = Trainer(make_cfg(tmp_path / "b", data), target=tiny_target("qwen3")).run()
    assert rest.step == 6
    assert {**part.losses, **rest.losses} == full.losses  # bitwise-equal floats
    a = DFlashDrafter.from_pretrained(tmp_path / "a" / "run" / "drafter")
    b = DFlashDrafter.from_pretrained(tmp_path / "b" / "run" / "drafter")
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(va, vb), k
    steps = [json.loads(l)["step"] for l in (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()
             if json.loads(l)["kind"] == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert [p.name for p in list_checkpoints(tmp_path / "b" / "run")] == ["step-00000004", "step-00000006"]
    assert (list_checkpoints(tmp_path / "b" / "run")[-1] / "config.yaml").is_file()


def test_sigterm_saves_and_stops(tmp_path, data):
    tr = Trainer(make_cfg(tmp_path, data, save_every=100), target=tiny_target("qwen3"))
    orig = tr.train_step

    def step_then_signal():
        m = orig()
        if tr.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return m

    tr.train_step = step_then_signal
    res = tr.run()
    assert res.stopped == "signal" and res.step == 2
    assert latest_checkpoint(tmp_path / "run").name == "step-00000002"
    assert Trainer(make_cfg(tmp_path, data), target=tiny_target("qwen3")).step == 2


def test_interrupted_checkpoint_write_keeps_the_previous_one(tmp_path, data, monkeypatch):
    tr = Trainer(make_cfg(tmp_path, data, save_every=100), target=tiny_target("qwen3"))
    tr.run(stop_after=1)
    good = latest_checkpoint(tmp_path / "run")
    tr.train_step()

    def boom(*a, **k):
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(ckpt_mod.torch, "save", boom)  # dies after drafter/ was written, before trainer.pt
    with pytest.raises(KeyboardInterrupt):
        tr.save()
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path / "run") == good
    resumed = Trainer(make_cfg(tmp_path, data), target=tiny_target("qwen3"))
    assert resumed.step == 1


def test_export_loads_and_decodes_and_eval_reports_tau(tmp_path, data):
    target = tiny_target("qwen3")
    prompts = random_prompts(2, 5, seed=9)
    tr = Trainer(make_cfg(tmp_path, data, max_steps=2, eval_every=1), target=target, eval_prompts=prompts)
    res = tr.run()
    assert res.eval is not None and 1.0 <= res.eval["tau"] <= 4.0
    assert len(res.eval["per_position_acceptance"]) == 3
    assert tr.data_stats.skipped_short == 2 and tr.data_stats.kept == 6
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(l["kind"] == "eval" for l in lines) and lines[0]["skipped_short"] == 2
    d = DFlashDrafter.from_pretrained(res.final_drafter, target)
    saved = json.loads((res.final_drafter / "config.json").read_text())
    assert saved["prompting"]["chat_template"] is False  # token records of a target without a template
    for method in ("dflash", "ddtree"):
        g = build_decoder(method, target, d, budget=6 if method == "ddtree" else None).generate(prompts[0], 12)
        assert g.tokens == hf_greedy(target, prompts[0], 12)  # lossless with the trained drafter


def test_bf16_autocast_only_where_the_hardware_has_bf16(tmp_path, data, monkeypatch, capsys):
    """bf16 is emulated (several times slower than fp32) on a CPU without AVX512-BF16/AMX: fp32 there, said once."""
    from flashdraft.train import loop

    monkeypatch.setattr(loop, "bf16_is_fast", lambda device: False)
    slow = Trainer(make_cfg(tmp_path / "slow", data, bf16=True, progress=True), target=tiny_target("qwen3"))
    assert slow.bf16 is False
    assert "no bf16 matmul hardware" in capsys.readouterr().err
    monkeypatch.setattr(loop, "bf16_is_fast", lambda device: True)
    fast = Trainer(make_cfg(tmp_path / "fast", data, bf16=True), target=tiny_target("qwen3"))
    assert fast.bf16 is True
    assert Trainer(make_cfg(tmp_path / "off", data, bf16=False), target=tiny_target("qwen3")).bf16 is False


def test_train_sequences_subsets_the_training_side_only(tmp_path):
    """train_sequences draws that many training sequences (seeded) and leaves the held-out set as it was;
    more than the data holds is a clear error."""
    data = write_data(tmp_path / "many.jsonl", n=12, short=0)
    target = tiny_target("qwen3")
    full = Trainer(make_cfg(tmp_path, data, holdout=0.25, out_dir=str(tmp_path / "a")), target=target)
    sub = Trainer(make_cfg(tmp_path, data, holdout=0.25, train_sequences=4, out_dir=str(tmp_path / "b")), target=target)
    again = Trainer(make_cfg(tmp_path, data, holdout=0.25, train_sequences=4, out_dir=str(tmp_path / "c")), target=target)
    ids = lambda exs: [tuple(e.token_ids) for e in exs]  # noqa: E731
    assert len(full.examples) == 9 and len(sub.examples) == 4
    assert set(ids(sub.examples)) < set(ids(full.examples))
    assert ids(sub.heldout) == ids(full.heldout) and not set(ids(sub.heldout)) & set(ids(sub.examples))
    assert ids(again.examples) == ids(sub.examples)
    with pytest.raises(TrainError, match="train_sequences 10 is more than the 9 training sequences"):
        Trainer(make_cfg(tmp_path, data, holdout=0.25, train_sequences=10, out_dir=str(tmp_path / "d")), target=target)


def test_scored_heldout_is_a_sample_of_every_data_file(tmp_path):
    """With several data files (or one written in blocks), the held-out sequences that are scored
    (holdout_max of them) are drawn from the whole held-out set, not its lowest-numbered ones (the first file)."""
    first = write_data(tmp_path / "first.jsonl", n=16, seed=1, short=0)
    second = write_data(tmp_path / "second.jsonl", n=16, seed=2, short=0)
    second_ids = {tuple(json.loads(l)["token_ids"]) for l in second.read_text().splitlines()}
    target = tiny_target("qwen3")
    from_second = []
    for seed in range(4):
        cfg = make_cfg(tmp_path, first, holdout=0.5, holdout_max=4, seed=seed, out_dir=str(tmp_path / f"s{seed}"))
        tr = Trainer(cfg.model_copy(update={"data": [str(first), str(second)]}), target=target)
        scored = [tuple(e.token_ids) for e in tr.heldout]
        assert len(scored) == 4 and not set(scored) & {tuple(e.token_ids) for e in tr.examples}
        from_second.append(sum(s in second_ids for s in scored))
    assert 4 <= sum(from_second) <= 12  # 16 scored in all, about half from each file; the lowest 4 of 16 held: ~0


def test_init_from_a_shallower_drafter_grows_it_and_starts_from_its_function(tmp_path, data):
    target = tiny_target("qwen3")
    one = Trainer(make_cfg(tmp_path / "one", data, max_steps=2), target=target).run()
    same = Trainer(make_cfg(tmp_path / "a", data, init_from=str(one.final_drafter)), target=target)
    deeper = Trainer(make_cfg(tmp_path / "b", data, init_from=str(one.final_drafter), num_layers=3), target=target)
    assert len(same.variants[0].drafter.layers) == 1 and len(deeper.variants[0].drafter.layers) == 3
    a, b = same.run(stop_after=1), deeper.run()
    assert b.losses[1] == pytest.approx(a.losses[1], rel=1e-5)  # identical function at the first step
    exported = DFlashDrafter.from_pretrained(b.final_drafter, target)
    assert exported.cfg.num_hidden_layers == 3
    assert float(exported.layers[2].mlp.down_proj.weight.detach().abs().sum()) > 0  # trained from zero


def test_init_from_trains_at_the_block_size_the_config_sets_else_at_its_own(tmp_path, data):
    target = tiny_target("qwen3")
    four = Trainer(make_cfg(tmp_path / "four", data, max_steps=2), target=target).run()  # block_size 4
    unset = {k: v for k, v in make_cfg(tmp_path, data).model_dump(exclude_unset=True).items() if k != "block_size"}
    cfg = TrainConfig(**{**unset, "init_from": str(four.final_drafter), "max_steps": 2, "out_dir": str(tmp_path / "v"),
                         "variants": [{"name": "own"}, {"name": "b6", "block_size": 6}]})
    res = Trainer(cfg, target=target).run()
    blocks = {v: DFlashDrafter.from_pretrained(tmp_path / "v" / v / "drafter", target).block_size for v in ("own", "b6")}
    assert blocks == {"own": 4, "b6": 6}
    assert res.step == 2
    six = load_drafter(tmp_path / "v" / "b6" / "drafter", target)
    gen = build_decoder("dflash", target, six).generate([5, 9, 11, 3], 12)
    assert gen.tokens == hf_greedy(target, [5, 9, 11, 3], 12) and max(gen.stats.taus) <= 6


def test_a_block_drafter_is_saved_with_its_calibrated_tree_temperature(tmp_path, data):
    res = Trainer(make_cfg(tmp_path, data, holdout=0.25, holdout_walk=2, tensorboard=False),
                  target=tiny_target("qwen3")).run()
    t = json.loads((res.final_drafter / "config.json").read_text())["tree_temperature"]
    rec = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    cal = [r for r in rec if r["kind"] == "tree_calibration"]
    assert len(cal) == 1 and cal[0]["tree_temperature"] == t and cal[0]["anchors"] > 0
    assert min(map(float, cal[0]["per_temperature"])) <= t <= max(map(float, cal[0]["per_temperature"]))
    again = Trainer(make_cfg(tmp_path, data, holdout=0.25, holdout_walk=2, calibrate_tree=False, tensorboard=False,
                             init_from=str(res.final_drafter), out_dir=str(tmp_path / "off")),
                    target=tiny_target("qwen3")).run()
    assert "tree_temperature" not in json.loads((again.final_drafter / "config.json").read_text())  # not inherited
    target = tiny_target("qwen3")
    assert build_decoder("ddtree", target, load_drafter(res.final_drafter, target)).tree_temperature == t
