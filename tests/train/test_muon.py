"""optimizer: muon (torch.optim.Muon on the hidden matrices, AdamW on the rest) through the unchanged Trainer: the
split, a falling loss, and a kill-and-resume that gives the same losses bit for bit."""

from __future__ import annotations

import pytest

from flashdraft.train.loop import Trainer
from flashdraft.train.optim import MuonAdamW
from tests.tiny import tiny_target

from .test_loop import make_cfg, write_data


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("data") / "train.jsonl")


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest(tmp_path, data):
    tr = Trainer(make_cfg(tmp_path, data, optimizer="muon", draft_vocab_size=64, max_steps=1), target=tiny_target("qwen3"))
    v = tr.variants[0]
    assert isinstance(v.optimizer, MuonAdamW)
    names = {id(p): n for n, p in v.drafter.named_parameters()}
    muon = {names[id(p)] for p in v.optimizer.muon.param_groups[0]["params"]}
    adamw = {names[id(p)] for p in v.optimizer.adamw.param_groups[0]["params"]}
    assert "fc.weight" in muon and "layers.0.self_attn.q_proj.weight" in muon and "layers.0.mlp.down_proj.weight" in muon
    assert "lm_head.weight" in adamw and "norm.weight" in adamw and "hidden_norm.weight" in adamw
    assert muon | adamw == set(names.values()) and not muon & adamw


def test_muon_loss_falls_and_resume_is_exact(tmp_path, data):
    cfg = dict(optimizer="muon", lr=3e-2, max_steps=20)
    full = Trainer(make_cfg(tmp_path / "a", data, **cfg), target=tiny_target("qwen3")).run()
    losses = list(full.losses.values())
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5, losses
    part = Trainer(make_cfg(tmp_path / "b", data, **cfg), target=tiny_target("qwen3")).run(stop_after=3)
    rest = Trainer(make_cfg(tmp_path / "b", data, **cfg), target=tiny_target("qwen3")).run()
    assert part.step == 3 and rest.step == 20
    assert {**part.losses, **rest.losses} == full.losses  # bitwise-equal floats
