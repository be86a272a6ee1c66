"""The held-out decode walk: rounds anchored where a greedy decoder anchors them, so its tau is the tau
real decoding measures (which the mean over random anchors, ``tau_proxy``, overstates)."""

from __future__ import annotations

import math

import pytest
import torch

from flashdraft.decode import build_decoder
from flashdraft.models.drafter import load_drafter
from flashdraft.models.forward import target_pass
from flashdraft.train.config import TrainConfig
from flashdraft.train.data import Example, collate
from flashdraft.train.diagnostics import (
    NgramBaseline, calibrate_tree, decode_anchors, heldout_report, reference_tokens, walk_batch, walk_taus,
    walk_tree_batch,
)
from flashdraft.train.loop import Trainer
from flashdraft.train.objectives import objective_class
from tests.tiny import MASK_ID, hf_greedy, random_prompts, tiny_target

PROMPT, NEW, BLOCK = 6, 40, 4


def test_walk_taus_anchor_after_each_round():
    # one row, anchors 0..9; accepted slots per anchor (block of 4: at most 3)
    chain = [2, 0, 1, 3, 0, 1, 0, 0, 2, 0]
    correct = torch.zeros(1, 10, BLOCK, dtype=torch.bool)
    for a, c in enumerate(chain):
        correct[0, a, 1 : 1 + c] = True
        if c < BLOCK - 1:
            correct[0, a, 2 + c :] = True  # hits after the first miss never count
    weights = torch.ones(1, 10, BLOCK)
    weights[..., 0] = 0
    anchors = torch.arange(10)[None]
    valid = torch.ones(1, 10, dtype=torch.bool)
    # anchor 0 accepts 2 (tau 3) -> anchor 3 accepts 3 (tau 4) -> anchor 7 (tau 1) -> 8 (tau 3) -> past the end
    assert walk_taus(correct, weights, anchors, valid) == [3, 4, 1, 3]
    valid[0, 7] = False  # a position that cannot anchor: the next round anchors at the next one that can
    assert walk_taus(correct, weights, anchors, valid) == [3, 4, 3]


def greedy_examples(target, n: int, seed: int) -> list[Example]:
    out = []
    for i, p in enumerate(random_prompts(n, PROMPT, seed=seed)):
        cont = hf_greedy(target, p, NEW + BLOCK)
        out.append(Example(token_ids=p + cont, loss_mask=[0] * PROMPT + [1] * len(cont), index=i))
    return out


FAMILIES = {
    "dflash": dict(num_layers=1, target_layer_ids=[1, 3], max_anchors=16),
    "eagle3": dict(objective="eagle3", ttt_steps=BLOCK - 1, target_layer_ids=[1, 2, 3], draft_vocab_size=64),
    # block hints: the walks must draft every block with prompt lookup's chain, as its decoders do
    "dflash_hints": dict(num_layers=1, target_layer_ids=[1, 3], max_anchors=16, block_hints="lookup"),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def trained(request, tmp_path_factory):
    """A tiny drafter of each family trained on the tiny target's own greedy continuations (which loop,
    then move on, so it accepts several tokens a round), saved and loaded as decoding loads it."""
    target = tiny_target("qwen3", initializer_range=0.1)
    cfg = TrainConfig(
        target="tiny", out_dir=str(tmp_path_factory.mktemp("walk")), block_size=BLOCK, mask_token_id=MASK_ID,
        max_len=64, batch_size=8, max_steps=300, lr=3e-3, warmup_ratio=0.05, save_every=1000, progress=False,
        tensorboard=False, seed=0, **FAMILIES[request.param],
    )
    train = greedy_examples(target, 48, seed=0)
    res = Trainer(cfg, target=target, examples=train).run()
    drafter = load_drafter(res.final_drafter, target)
    return target, objective_class(cfg.objective).from_config(drafter, cfg), train


def test_walk_tau_is_what_greedy_decoding_measures(trained):
    target, objective, _ = trained
    drafter = objective.drafter
    dec = build_decoder(objective.eval_method, target, drafter)
    real, walked = [], []
    for ex in greedy_examples(target, 6, seed=1):  # prompts never trained on
        g = dec.generate(ex.token_ids[:PROMPT], NEW)
        assert g.tokens == ex.token_ids[PROMPT : PROMPT + len(g.tokens)]  # lossless: the same greedy sequence
        batch = collate([[ex]], [0])
        feats, final = target_pass(target, batch, drafter.target_layer_ids, want_final=True)
        taus = walk_batch(objective, batch, feats, final)["drafter"]
        n = 0  # compare the rounds real decoding ran in full (the walk goes on to the data's end)
        while n < len(g.stats.taus) and sum(g.stats.taus[: n + 1]) <= NEW - BLOCK:
            n += 1
        real += g.stats.taus[:n]
        walked += taus[:n]
    assert len(real) >= 30
    assert sum(real) / len(real) > 1.2, real  # the drafter accepts: the comparison is not all tau 1
    assert walked == real


def test_heldout_report_walks_the_drafter_and_the_baselines(trained):
    target, objective, train = trained
    examples = greedy_examples(target, 6, seed=1)
    ngram = NgramBaseline(train)
    ids = objective.drafter.target_layer_ids
    rep = heldout_report(objective, examples, lambda b, rows: target_pass(target, b, ids, True), ngram,
                         batch_size=4, walk=6)
    assert rep["walk_rounds"] >= 6 * NEW // BLOCK
    assert all(1.0 <= rep[k]["walk_tau"] <= BLOCK for k in ("drafter", "bigram", "prompt_lookup"))
    # rounds start right after a miss: the walk is below the mean over random anchors
    assert rep["drafter"]["walk_tau"] < rep["drafter"]["tau_proxy"]


@pytest.mark.parametrize("trained", ["dflash", "dflash_hints"], indirect=True)  # DDTree reads a block drafter's marginals
def test_tree_walk_is_what_ddtree_decoding_measures(trained):
    target, objective, _ = trained
    drafter = objective.drafter
    dec = build_decoder("ddtree", target, drafter, budget=6)
    assert dec.hints == (drafter.cfg.block_hints or "none")
    real, walked, accepted, expected = [], [], [], []
    for ex in greedy_examples(target, 6, seed=1):
        g = dec.generate(ex.token_ids[:PROMPT], NEW)
        assert g.tokens == ex.token_ids[PROMPT : PROMPT + len(g.tokens)]
        batch = collate([[ex]], [0])
        feats, final = target_pass(target, batch, drafter.target_layer_ids, want_final=True)
        out = walk_tree_batch(objective, batch, feats, final, budget=6, temperatures=(1.0, 0.01))
        n = 0
        while n < len(g.stats.taus) and sum(g.stats.taus[: n + 1]) <= NEW - BLOCK:
            n += 1
        real += g.stats.taus[:n]
        walked += out[1.0]["taus"][:n]
        accepted += out[1.0]["accepted"]
        expected += out[1.0]["expected"]
        # near-zero temperature: the argmax chain comes first in the tree, so the tree accepts at least as much
        assert all(a >= c for a, c in zip(out[0.01]["accepted"], walk_chain(objective, batch, feats, final)))
    assert len(real) >= 30
    assert walked == real
    assert sum(walked) / len(walked) > 1.2
    assert len(accepted) == len(expected) and all(0 <= e <= 6 for e in expected)


def walk_chain(objective, batch, feats, final) -> list[int]:
    """Per anchor (the order walk_tree_batch visits them), the drafts the argmax chain accepts."""
    bl = objective.blocks(batch, every_anchor=True, evaluate=True)  # as decoding drafts (hints in every block)
    ref = reference_tokens(objective.drafter.target, bl, final)
    pred = objective(batch, bl, 1.0, features=feats, final_h=final).pred.cpu()
    can_anchor = decode_anchors(batch, bl)
    hits = ((pred == ref) & (bl.weights.cpu() > 0))[..., 1:].long().cumprod(-1).sum(-1)  # [b, A]
    return [int(hits[r, a]) for r, a in can_anchor.nonzero().tolist()]


@pytest.mark.parametrize("trained", ["dflash"], indirect=True)
def test_calibrated_tree_estimates_its_own_acceptance(trained):
    target, objective, _ = trained
    ids = objective.drafter.target_layer_ids
    examples = greedy_examples(target, 6, seed=1)  # never trained on
    features_of = lambda b, rows: target_pass(target, b, ids, True)  # noqa: E731
    cal = calibrate_tree(objective, examples, features_of, budget=6)
    t, per = cal["tree_temperature"], cal["per_temperature"]
    assert min(per) <= t <= max(per) and cal["anchors"] >= 6 * NEW // 2

    def miscalibration(temp: float) -> float:
        p = calibrate_tree(objective, examples, features_of, budget=6, temperatures=(temp,))["per_temperature"][temp]
        return abs(math.log(p["expected"] / p["accepted"]))

    assert miscalibration(t) <= min(miscalibration(x) for x in (min(per), 1.0, max(per))) + 0.02


def test_baseline_walks_are_not_capped_by_a_draft_vocabulary():
    """Prompt lookup drafts any token of the context: its walk is the same whatever the drafter's draft vocabulary,
    while the drafter's own walk counts a token outside its vocabulary as a miss."""
    from flashdraft.models.dflash import DFlashDrafter

    target = tiny_target("qwen3", initializer_range=0.1)
    examples = greedy_examples(target, 4, seed=1)
    batch = collate([[e] for e in examples], [0] * len(examples))
    ngram = NgramBaseline(examples)
    walks = {}
    for name, vocab in (("full", None), ("cut", torch.arange(8))):  # 8 of the target's ids only
        d = DFlashDrafter.for_target(target, num_layers=1, block_size=BLOCK, target_layer_ids=[1, 3],
                                     mask_token_id=MASK_ID, draft_vocab=vocab)
        cfg = TrainConfig(target="tiny", block_size=BLOCK, mask_token_id=MASK_ID, target_layer_ids=[1, 3],
                          draft_vocab_size=None if vocab is None else 8)
        obj = objective_class("dflash").from_config(d, cfg)
        feats, final = target_pass(target, batch, d.target_layer_ids, want_final=True)
        walks[name] = walk_batch(obj, batch, feats, final, ngram)
    assert walks["cut"]["prompt_lookup"] == walks["full"]["prompt_lookup"]
    assert walks["cut"]["trigram"] == walks["full"]["trigram"]
    assert sum(walks["full"]["prompt_lookup"]) / len(walks["full"]["prompt_lookup"]) > 1.0
