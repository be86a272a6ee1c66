"""The eagle3 objective through the unchanged Trainer: the loss falls, files reload to the same proposals,
resume is exact, offline features (with final hidden states) equal the online pass, variants mix with
DFlash, the eval decodes with the EAGLE-3 chain and the held-out diagnostics run."""

from __future__ import annotations

import json

import pytest
import torch

from flashdraft.models.drafter import load_drafter
from flashdraft.models.eagle3 import Eagle3Drafter
from flashdraft.train.data import load_examples
from flashdraft.train.features import write_features
from flashdraft.train.loop import Trainer
from flashdraft.train.objective import TrainError
from tests.tiny import random_prompts, tiny_target

from .test_loop import make_cfg, write_data

EAGLE = dict(objective="eagle3", ttt_steps=3, target_layer_ids=[1, 2, 3], draft_vocab_size=64, lr=3e-3)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("data") / "train.jsonl")


def test_loss_falls_and_the_saved_drafter_proposes_the_same(tmp_path, data):
    tr = Trainer(make_cfg(tmp_path, data, **EAGLE, max_steps=12, eval_every=6, holdout=0.25),
                 target=tiny_target("qwen3"), eval_prompts=random_prompts(2, 6))
    res = tr.run()
    losses = list(res.losses.values())
    assert res.stopped == "done" and len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
    assert res.eval is not None and res.eval["method"] == "eagle3" and res.eval["tau"] >= 1
    assert res.heldout and "drafter" in next(iter(res.heldout.values()))
    recs = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    assert len(train[-1]["acc_per_slot"]) == 3 and 1 <= train[-1]["tau_proxy"] <= 4
    trained = tr.variants[0].drafter.eval()
    loaded = load_drafter(res.final_drafter, trained.target)
    assert type(loaded) is Eagle3Drafter and loaded.max_depth == 3 and loaded.cfg.draft_vocab_size == 64
    toks = torch.tensor(random_prompts(1, 14)[0])
    feats = torch.randn(13, trained.fc.in_features)
    trained.reset(), loaded.reset()
    m = trained.vocab.t2d
    a, b = trained.propose(toks, feats)[:, m], loaded.propose(toks, feats)[:, m]
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)  # the feature scale folded into fc.weight
    assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_kill_and_resume_gives_the_same_losses(tmp_path, data):
    full = Trainer(make_cfg(tmp_path / "a", data, **EAGLE), target=tiny_target("qwen3")).run()
    part = Trainer(make_cfg(tmp_path / "b", data, **EAGLE), target=tiny_target("qwen3")).run(stop_after=3)
    rest = Trainer(make_cfg(tmp_path / "b", data, **EAGLE), target=tiny_target("qwen3")).run()
    assert part.step == 3 and rest.step == 6
    assert {**part.losses, **rest.losses} == full.losses  # bitwise-equal floats


def test_offline_features_give_the_online_losses(tmp_path, data):
    target = tiny_target("qwen3")
    examples, _ = load_examples([str(data)], target, 64, 4)
    no_final = write_features(target, examples, [1, 2, 3], tmp_path / "f0", shard_size=4, with_final=False, dtype="float32", progress=False)
    with pytest.raises(TrainError, match="final"):
        Trainer(make_cfg(tmp_path / "x", data, **EAGLE, features=str(no_final)), target=tiny_target("qwen3"))
    cache = write_features(target, examples, [1, 2, 3], tmp_path / "f1", shard_size=4, with_final=True, dtype="float32", progress=False)
    online = Trainer(make_cfg(tmp_path / "on", data, **EAGLE), target=tiny_target("qwen3")).run()
    offline = Trainer(make_cfg(tmp_path / "off", data, **EAGLE, features=str(cache)), target=tiny_target("qwen3")).run()
    for k in online.losses:  # fp32 cache: equal up to the batched-vs-single target forward's rounding
        assert offline.losses[k] == pytest.approx(online.losses[k], rel=1e-5, abs=1e-6)


def test_eagle3_and_dflash_variants_train_from_one_target_pass(tmp_path, data):
    cfg = make_cfg(tmp_path, data, max_steps=2, target_layer_ids=[1, 2, 3], variants=[
        {"name": "dflash"}, {"name": "eagle", "objective": "eagle3", "ttt_steps": 2}])
    res = Trainer(cfg, target=tiny_target("qwen3")).run()
    assert set(res.variants) == {"dflash", "eagle"}
    assert type(load_drafter(res.variants["eagle"]["final_drafter"])) is Eagle3Drafter


def _ddp_rank(rank: int, world: int, port: int, tmp: str, data: str) -> None:
    import os
    from pathlib import Path

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        res = Trainer(make_cfg(Path(tmp), data, **EAGLE, grad_accum=1, max_steps=3), target=tiny_target("qwen3")).run()
        Path(tmp, f"losses{rank}.json").write_text(json.dumps(res.losses))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_match_one_process_with_accumulation(tmp_path, data):
    import os

    import torch.multiprocessing as mp

    single = Trainer(make_cfg(tmp_path / "one", data, **EAGLE, grad_accum=2, max_steps=3), target=tiny_target("qwen3")).run()
    mp.spawn(_ddp_rank, args=(2, 29500 + (os.getpid() + 11) % 1000, str(tmp_path / "two"), str(data)), nprocs=2, join=True)
    l0 = {int(k): v for k, v in json.loads((tmp_path / "two" / "losses0.json").read_text()).items()}
    assert list(l0) == list(single.losses)
    for k in l0:
        assert l0[k] == pytest.approx(single.losses[k], rel=1e-5)


def test_draft_rows_only_teacher_equals_the_full_vocabulary_rule_on_greedy_data(tmp_path, data):
    """On the target's own greedy continuations the target's argmax is the data token, so dropping slots by the
    data token (LM head over the draft rows only) gives the losses of the full-vocabulary argmax rule."""
    full = Trainer(make_cfg(tmp_path / "a", data, **EAGLE, max_steps=3), target=tiny_target("qwen3")).run()
    rows = Trainer(make_cfg(tmp_path / "b", data, **EAGLE, max_steps=3, full_vocab_argmax=False),
                   target=tiny_target("qwen3")).run()
    assert list(full.losses) == list(rows.losses)
    for a, b in zip(full.losses.values(), rows.losses.values()):
        assert abs(a - b) <= 1e-4 * abs(a), (full.losses, rows.losses)
