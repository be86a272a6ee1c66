"""Block hints: a DFlash drafter's draft slots filled with prompt lookup's chain instead of MASK, in training
(``block_hints: lookup``) and in the dflash / ddtree / ddtree_ngram decoders (``hints``), lossless either way."""

from __future__ import annotations

import json

import pytest
import torch

from flashdraft.decode import DecodeError, build_decoder
from flashdraft.decode.lookup import lookup, lookup_hints
from flashdraft.models.dflash import DFlashDrafter
from flashdraft.models.drafter import load_drafter
from flashdraft.train.config import TrainConfig
from flashdraft.train.data import Example, collate
from flashdraft.train.loop import Trainer
from flashdraft.train.objective import DFlashObjective, hinted_inputs, sample_anchors
from tests.lossless import assert_same_tokens
from tests.tiny import MASK_ID, hf_greedy, random_prompts, tiny_target


def test_lookup_hints_are_the_lookup_chain_or_mask():
    seq = torch.tensor([5, 6, 7, 8, 9, 10, 11, 5, 6])  # "5 6" was followed by 7 8 9 ...
    assert lookup_hints(seq, 4, MASK_ID).tolist() == lookup(seq, 4, 3, 1)[0] == [7, 8, 9, 10]
    assert lookup_hints(torch.tensor([1, 2, 3, 4]), 3, MASK_ID).tolist() == [MASK_ID] * 3  # nothing recurs


def test_training_hints_come_from_the_anchors_own_document():
    """Packed rows: a block's hints are lookup over its own document up to the anchor, never the row's earlier
    document; ``hint_prob`` 0 leaves MASK, 1 hints every valid block."""
    doc_a, doc_b = [3, 4, 5, 6, 7, 8], [3, 4, 9, 10, 3, 4, 9, 10, 11]
    batch = collate([[Example(token_ids=doc_a, loss_mask=[1] * 6, index=0),
                      Example(token_ids=doc_b, loss_mask=[1] * 9, index=1)]], [7])
    anchors, valid = sample_anchors(batch, 100)
    B = 4
    none = hinted_inputs(batch, anchors, valid, B, MASK_ID, 0.0)
    assert (none[..., 1:] == MASK_ID).all() and (none[..., 0] == batch.input_ids.gather(1, anchors)).all()
    full = hinted_inputs(batch, anchors, valid, B, MASK_ID, 1.0)
    ids, pos = batch.input_ids[0], batch.positions[0]
    for j in valid[0].nonzero().flatten().tolist():
        t = int(anchors[0, j])
        own = ids[t - int(pos[t]) : t + 1]
        assert full[0, j, 1:].tolist() == lookup_hints(own, B - 1, MASK_ID).tolist()
    # doc_b's first "3 4" (row positions 6, 7) must not match doc_a's "3 4" (which was followed by 5)
    t = 6 + 1
    j = anchors[0].tolist().index(t)
    assert full[0, j, 1:].tolist() == [MASK_ID] * (B - 1)


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_hinted_decoders_are_lossless_and_the_hints_reach_the_drafter(family):
    target = tiny_target(family)
    drafter = DFlashDrafter.for_target(target, num_layers=1, block_size=6, mask_token_id=MASK_ID, seed=3)
    prompts = random_prompts(2, 16, seed=4)
    prompts.append(prompts[0][:8] * 3)  # lookup finds matches here
    for method, budget in (("dflash", None), ("ddtree", 12), ("ddtree_ngram", 12)):
        dec = build_decoder(method, target, drafter, budget=budget, hints="lookup")
        assert dec.hints == "lookup"
        for p in prompts:
            res = dec.generate(p, 24)
            assert_same_tokens(target, p, res.tokens, hf_greedy(target, p, 24), f"{method}+hints/{family}")
    tokens = torch.tensor(prompts[-1])
    feats = torch.randn(len(tokens) - 1, len(drafter.target_layer_ids) * target.config.hidden_size)
    drafter.reset()
    plain = drafter.propose(tokens, feats)
    drafter.reset()
    hinted = drafter.propose(tokens, feats, hints=lookup_hints(tokens, 5, MASK_ID))
    assert not torch.allclose(plain, hinted)  # the slots' inputs changed what the drafter says
    assert build_decoder("dflash", target, drafter).hints == "none"  # a drafter without block_hints: MASK
    with pytest.raises(DecodeError, match="hints 'copy' is not one of lookup, none"):
        build_decoder("dflash", target, drafter, hints="copy")


def test_a_drafter_trained_with_hints_reads_them(tmp_path):
    """On sequences that repeat a random segment, a drafter trained with block_hints learns to use the copy the
    hints offer: it drafts with them far better than without them, and its config.json makes flashdraft's
    decoders fill them in by default (decoding stays lossless)."""
    target = tiny_target("qwen3")
    g = torch.Generator().manual_seed(0)

    def examples(n, offset):
        out = []
        for i in range(n):
            seg = torch.randint(0, MASK_ID, (10,), generator=g).tolist()
            out.append(Example(token_ids=seg * 4, loss_mask=[0] * 10 + [1] * 30, index=offset + i))
        return out

    cfg = TrainConfig(target="tiny", out_dir=str(tmp_path), block_size=6, mask_token_id=MASK_ID, num_layers=1,
                      target_layer_ids=[1, 3], max_len=64, batch_size=8, max_steps=300, lr=3e-3, max_anchors=16,
                      save_every=1000, progress=False, tensorboard=False, seed=0, block_hints="lookup",
                      hint_prob=0.5)
    res = Trainer(cfg, target=target, examples=examples(64, 0)).run()
    assert json.loads((res.final_drafter / "config.json").read_text())["block_hints"] == "lookup"
    drafter = load_drafter(res.final_drafter, target)
    held = examples(8, 1000)
    batch = collate([[e] for e in held], [e.index for e in held])
    taus = {}
    for name in ("hints", "mask"):
        drafter.cfg.block_hints = "lookup" if name == "hints" else None
        obj = DFlashObjective(drafter, max_anchors=16)
        bl = obj.blocks(batch, evaluate=True)
        out = obj(batch, bl, 1.0)
        sup = bl.weights > 0
        taus[name] = float(1 + (out.correct & sup)[..., 1:].long().cumprod(-1).sum(-1)[sup[..., 1]].float().mean())
    assert taus["hints"] > 4.0 and taus["hints"] > taus["mask"] + 1.0, taus
    drafter = load_drafter(res.final_drafter, target)
    dec = build_decoder("dflash", target, drafter)
    assert dec.hints == "lookup"
    p = held[0].token_ids[:20]
    out = dec.generate(p, 20)
    assert_same_tokens(target, p, out.tokens, hf_greedy(target, p, 20), "dflash+hints/trained")
    # training on from it keeps its hints unless told otherwise
    for hints, saved in ((None, "lookup"), ("none", None)):
        more = cfg.model_copy(update=dict(out_dir=str(tmp_path / f"more-{hints}"), init_from=str(res.final_drafter),
                                          max_steps=1, block_hints=hints))
        again = Trainer(more, target=target, examples=examples(8, 2000)).run()
        assert json.loads((again.final_drafter / "config.json").read_text()).get("block_hints") == saved


def test_block_hints_need_a_block_drafter():
    with pytest.raises(ValueError, match="block_hints 'lookup' fills a DFlash block"):
        TrainConfig(target="tiny", objective="eagle3", block_hints="lookup")
