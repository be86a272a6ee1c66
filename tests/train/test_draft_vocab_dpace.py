"""Reduced draft vocabulary (d2t/t2d from token frequencies) and D-PACE position weights."""

from __future__ import annotations

import math

import pytest
import torch

from flashdraft.decode import build_decoder
from flashdraft.models.dflash import DFlashDrafter
from flashdraft.models.forward import lm_logits
from types import SimpleNamespace

from flashdraft.train.data import Example, draft_vocab_for
from flashdraft.train.objective import DFlashObjective, TrainError, dpace_weights
from tests.tiny import MASK_ID, VOCAB, hf_greedy, random_prompts, tiny_target

from .test_objective import blocks_at, one_row


def test_draft_vocab_is_the_most_frequent_supervised_tokens():
    ex = [Example([5, 7, 7, 9, 9, 9, 3], [0, 1, 1, 1, 1, 1, 0], 0), Example([3, 3, 3, 3, 7], [0, 0, 0, 0, 1], 1)]
    target = SimpleNamespace(vocab_size=VOCAB, eos_token_ids=[])
    # supervised counts: 9 x3, 7 x3; then by count anywhere: 3 x5 (never supervised), 5 x1; then lower id
    assert draft_vocab_for(ex, target, 2).tolist() == [7, 9]
    assert draft_vocab_for(ex, target, 3).tolist() == [3, 7, 9]
    assert draft_vocab_for(ex, target, 5).tolist() == [0, 3, 5, 7, 9]
    # the target's end-of-turn id is always in (it ends every answer the drafter should finish)
    assert draft_vocab_for(ex, SimpleNamespace(vocab_size=VOCAB, eos_token_ids=[1]), 2).tolist() == [1, 7]
    with pytest.raises(TrainError, match="draft_vocab_size"):
        draft_vocab_for(ex, target, VOCAB + 1)


def drafter_with_vocab(target, ids, B=4):
    return DFlashDrafter.for_target(target, num_layers=1, block_size=B, target_layer_ids=[1, 3], mask_token_id=MASK_ID,
                                    seed=1, draft_vocab=torch.tensor(ids))


def test_draft_head_starts_as_the_target_rows_and_round_trips(tmp_path):
    target = tiny_target("qwen3")
    ids = [40, 3, 17, 88, 5]
    d = drafter_with_vocab(target, ids)
    assert d.draft_token_ids().tolist() == sorted(ids) and d.t2d.sum() == len(ids)
    assert d.t2d_index()[17].item() == 2 and d.t2d_index()[18].item() == -1
    h = torch.randn(3, target.hidden_size)
    full = lm_logits(target, h)  # [3, V]
    got = d.logits(h)
    torch.testing.assert_close(got[:, sorted(ids)], full[:, sorted(ids)])
    assert torch.isinf(got[:, 18]).all()
    d.save_pretrained(tmp_path / "dv")
    back = DFlashDrafter.from_pretrained(tmp_path / "dv", target)
    assert back.cfg.draft_vocab_size == 5 and torch.equal(back.d2t, d.d2t) and torch.equal(back.t2d, d.t2d)


def test_draft_vocab_training_ignores_labels_it_cannot_draft_and_decodes_losslessly():
    target = tiny_target("qwen3")
    ids = list(range(0, 60))
    seq = torch.randint(0, MASK_ID, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    batch = one_row(seq, [0] * 4 + [1] * 20)
    d = drafter_with_vocab(target, ids)
    obj = DFlashObjective(d, max_anchors=6)
    bl = obj.blocks(batch)
    sup = bl.weights > 0
    assert sup.any() and (bl.labels[sup] < 60).all()  # no weight on labels outside the draft vocabulary
    full = blocks_at(batch, bl.anchors[0].tolist(), B=4)
    assert (full.weights[(full.labels >= 60) & (full.weights > 0)]).numel() > 0  # the data has such labels
    out = obj(batch, bl, bl.norm)
    out.loss.backward()
    assert d.lm_head.weight.grad is not None and d.lm_head.weight.grad.abs().sum() > 0
    with pytest.raises(TrainError, match="exclude each other"):
        DFlashObjective(d, loss_vocab=8)
    prompt = random_prompts(1, 5, seed=3)[0]
    for method in ("dflash", "ddtree"):
        g = build_decoder(method, target, d, budget=5 if method == "ddtree" else None).generate(prompt, 10)
        assert g.tokens == hf_greedy(target, prompt, 10)


def test_dpace_weights_hand_checked():
    q = torch.tensor([[[0.0, 0.5, 1.0, 0.0, 0.5]]])  # slot 0 ignored
    sup = torch.tensor([[[False, True, True, True, True]]])
    w = dpace_weights(q, sup, alpha=0.0)
    # prefix products: 0.5, 0.5, 0, 0 -> suffix sums 1.0, 0.5, 0, 0
    torch.testing.assert_close(w[0, 0], torch.tensor([0.0, 1.0, 0.5, 0.0, 0.0]))
    w = dpace_weights(q, sup, alpha=0.5)  # q' = 0.75, 1.0, 0.5, 0.75 -> prefix 0.75, 0.75, 0.375, 0.28125
    p = [0.75, 0.75, 0.375, 0.28125]
    want = [0.0] + [sum(p[k:]) for k in range(4)]
    torch.testing.assert_close(w[0, 0], torch.tensor(want))
    sup2 = sup.clone()
    sup2[0, 0, 2] = False  # an unsupervised slot ends the chain
    w2 = dpace_weights(q, sup2, alpha=0.5)
    assert w2[0, 0, 2:].tolist() == [0.0, 0.0, 0.0] and w2[0, 0, 1] == pytest.approx(0.75)


def test_dpace_objective_normalises_by_anchors_and_weights_by_own_probabilities():
    target = tiny_target("qwen3")
    d = DFlashDrafter.for_target(target, num_layers=1, block_size=4, target_layer_ids=[1, 3], mask_token_id=MASK_ID, seed=1)
    seq = torch.randint(0, MASK_ID, (20,), generator=torch.Generator().manual_seed(6)).tolist()
    batch = one_row(seq, [0] * 3 + [1] * 17)
    obj = DFlashObjective(d, max_anchors=5, position_weights="dpace", dpace_alpha=0.5)
    bl = obj.blocks(batch)
    assert bl.norm == 5 and set(bl.weights.unique().tolist()) <= {0.0, 1.0}
    out = obj(batch, bl, bl.norm)
    # recompute by hand: per-slot CE and q = exp(-CE) of the drafter, weights from dpace_weights
    with torch.no_grad():
        ref = DFlashObjective(d, max_anchors=5)
        from flashdraft.models.forward import target_pass

        feats, _ = target_pass(target, batch, d.target_layer_ids, False)
        h = d.train_hidden(feats, batch.input_ids, batch.doc_ids, batch.positions, bl.anchors)
        logp = torch.log_softmax(lm_logits(target, h.flatten(0, 2)), -1).view(*h.shape[:3], -1)
        lp = logp.gather(-1, bl.labels[..., None])[..., 0]  # [b, A, B]
        sup = bl.weights > 0
        w = dpace_weights(lp.exp(), sup, 0.5)
        want = float((-lp * w)[sup].sum() / 5)
    assert float(out.loss.detach()) == pytest.approx(want, rel=1e-5)
    assert ref.position_weights == "decay" and math.isfinite(float(out.loss.detach()))
