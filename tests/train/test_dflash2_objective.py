"""The dflash2 objective through the unchanged Trainer: the loss falls, the selector's metrics are logged, the
saved drafter reloads to the same proposals, resume is exact, and the eval and held-out diagnostics run."""

from __future__ import annotations

import json

import pytest
import torch

from flashdraft.models.dflash import DFlash2Drafter
from flashdraft.models.drafter import load_drafter
from flashdraft.train.loop import Trainer
from flashdraft.train.objective import TrainError
from flashdraft.train.objective_dflash2 import DFlash2Objective, selector_candidates
from tests.tiny import random_prompts, tiny_target

from .test_loop import make_cfg, write_data

DFLASH2 = dict(objective="dflash2", block_size=4, conv_group_size=8, selector_rank=16, selector_top_k=8, lr=3e-3)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("data") / "train.jsonl")


def test_selector_candidates_put_a_missing_label_last():
    unary = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0], [5.0, 4.0, 3.0, 2.0, 1.0]])
    cand, place, inside = selector_candidates(unary.topk(3, dim=-1).indices, torch.tensor([1, 4]))
    assert cand.tolist() == [[0, 1, 2], [0, 1, 4]] and place.tolist() == [1, 2] and inside.tolist() == [True, False]


def test_loss_falls_and_the_saved_drafter_proposes_the_same(tmp_path, data):
    tr = Trainer(make_cfg(tmp_path, data, **DFLASH2, max_steps=12, eval_every=6, holdout=0.25),
                 target=tiny_target("qwen3"), eval_prompts=random_prompts(2, 6))
    res = tr.run()
    losses = list(res.losses.values())
    assert res.stopped == "done" and len(losses) == 12
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
    assert res.eval is not None and res.eval["tau"] >= 1
    held = next(iter(res.heldout.values()))
    assert res.heldout and "drafter" in held and "drafter_unary" in held  # after and before reranking
    assert 0 <= held["candidate_recall"] <= 1 and 0 <= held["selector_acc"] <= 1
    train = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in train if r["kind"] == "train"]
    assert 0 <= train[-1]["candidate_recall"] <= 1 and 0 <= train[-1]["selector_acc"] <= 1
    assert train[-1]["candidate_recall"] > train[0]["candidate_recall"]
    trained = tr.variants[0].drafter.eval()
    loaded = load_drafter(res.final_drafter, trained.target)
    assert type(loaded) is DFlash2Drafter
    toks = torch.tensor(random_prompts(1, 14)[0])
    feats = torch.randn(13, trained.fc.in_features)
    trained.reset(), loaded.reset()
    a, b = trained.propose_scores(toks, feats)[0], loaded.propose_scores(toks, feats)[0]
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    fin = torch.isfinite(a)
    assert torch.equal(fin, torch.isfinite(b))
    torch.testing.assert_close(a[fin], b[fin], rtol=1e-4, atol=1e-4)  # the feature scale folded into fc.weight


def test_kill_and_resume_gives_the_same_losses(tmp_path, data):
    full = Trainer(make_cfg(tmp_path / "a", data, **DFLASH2), target=tiny_target("qwen3")).run()
    part = Trainer(make_cfg(tmp_path / "b", data, **DFLASH2), target=tiny_target("qwen3")).run(stop_after=3)
    rest = Trainer(make_cfg(tmp_path / "b", data, **DFLASH2), target=tiny_target("qwen3")).run()
    assert part.step == 3 and rest.step == 6
    assert {**part.losses, **rest.losses} == full.losses  # bitwise-equal floats


def test_dflash2_objective_refuses_a_dflash_drafter_and_sampled_softmax():
    from flashdraft.models.dflash import DFlashDrafter
    from tests.tiny import MASK_ID

    target = tiny_target("qwen3")
    plain = DFlashDrafter.for_target(target, num_layers=1, block_size=4, mask_token_id=MASK_ID)
    with pytest.raises(TrainError, match="trains a DFlash2 drafter"):
        DFlash2Objective(plain)
    d2 = DFlash2Drafter.for_target(target, num_layers=1, block_size=4, mask_token_id=MASK_ID, conv_group_size=8,
                                   selector_rank=8, selector_top_k=4)
    with pytest.raises(TrainError, match="loss_vocab"):
        DFlash2Objective(d2, loss_vocab=16)


@torch.no_grad()
def test_predictions_are_the_served_pick_unary_argmax_when_the_selector_adds_nothing():
    """pred is the best rescored candidate after the true predecessor: with a selector that adds 0 it is the unary
    argmax (DFlash's pred on the same weights); with one that names the label after its true predecessor, the
    label wherever its true predecessor names it (every candidate is the whole vocabulary here)."""
    from flashdraft.models.dflash import DFlashDrafter
    from flashdraft.train.objective import Batch, DFlashObjective
    from tests.tiny import MASK_ID, hf_greedy

    target = tiny_target("qwen3")
    d2 = DFlash2Drafter.for_target(target, num_layers=1, block_size=4, mask_token_id=MASK_ID, seed=2,
                                   conv_group_size=8, selector_rank=96, selector_top_k=96)
    d1 = DFlashDrafter.for_target(target, num_layers=1, block_size=4, mask_token_id=MASK_ID, seed=2)
    d1.load_state_dict(d2.state_dict(), strict=False)
    p = random_prompts(1, 6, seed=5)[0]
    ids = p + hf_greedy(target, p, 20)
    T = len(ids)
    batch = Batch(torch.tensor([ids]), torch.tensor([[0] * 6 + [1] * 20], dtype=torch.bool),
                  torch.zeros(1, T, dtype=torch.long), torch.arange(T)[None], [0])
    o1, o2 = DFlashObjective(d1, max_anchors=6), DFlash2Objective(d2, max_anchors=6)
    bl = o2.blocks(batch)
    d2.candidate_selector.successor_codebook.zero_()
    assert torch.equal(o2(batch, bl, 1.0).pred, o1(batch, bl, 1.0).pred)
    sel = d2.candidate_selector  # transition(h, prev, c) = 1e4 when c is the token after prev in this sequence
    sel.hidden_projection.weight.zero_()
    d2.candidate_selector.hidden_projection.register_forward_hook(lambda m, args, out: out + 1.0)
    sel.predecessor_codebook.zero_()
    nxt = {}
    for a, b in zip(ids[5:], ids[6:]):  # the supervised part: the first successor seen after each token
        if nxt.setdefault(a, b) == b:
            sel.predecessor_codebook[a, a] = 1.0
            sel.successor_codebook[b, a] = 1e4
    out = o2(batch, bl, 1.0)
    prev = torch.cat([bl.labels[..., :1], bl.labels[..., :-1]], dim=-1)
    w = (bl.weights > 0) & torch.tensor([[[nxt.get(int(a)) == int(b) for a, b in zip(pa, la)]
                                          for pa, la in zip(prow, lrow)] for prow, lrow in zip(prev, bl.labels)])
    assert w.sum() >= 8
    assert torch.equal(out.pred[w], bl.labels[w]) and bool(out.correct[w].all())


def test_init_from_a_dflash_drafter_starts_a_dflash2_that_drafts_as_it_did(tmp_path, data):
    from flashdraft.models.dflash import DFlashDrafter

    base = Trainer(make_cfg(tmp_path / "dflash", data, block_size=4, max_steps=3), target=tiny_target("qwen3")).run()
    tr = Trainer(make_cfg(tmp_path / "up", data, **{**DFLASH2, "init_from": str(base.final_drafter)}, max_steps=2),
                 target=tiny_target("qwen3"))
    up, old = tr.variants[0].drafter.eval(), load_drafter(base.final_drafter, tr.target).eval()
    assert type(up) is DFlash2Drafter and type(old) is DFlashDrafter
    toks = torch.tensor(random_prompts(1, 14)[0])
    feats = torch.randn(13, old.fc.in_features)
    up.reset(), old.reset()
    assert torch.equal(up.propose_scores(toks, feats)[0].argmax(-1), old.propose(toks, feats).argmax(-1))
    res = tr.run()
    assert res.stopped == "done" and type(load_drafter(res.final_drafter, tr.target)) is DFlash2Drafter
