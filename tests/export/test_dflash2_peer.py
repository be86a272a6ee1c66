"""DFlash2 held against speculators 0.9's own ``DFlash2DraftModel``, loaded from ``flashdraft export --to
speculators``: the same block hidden states and unary logits, the same selector scores for the same candidates and
predecessors; and the export / import round trip is bit-identical."""

from __future__ import annotations

import json

import pytest
import speculators.models.dflash.core as spec_core
import torch
from speculators.models.dflash2 import DFlash2DraftModel, DFlash2SpeculatorConfig

from flashdraft.export import ExportError, export_drafter, import_drafter
from flashdraft.models.dflash import DFlash2Drafter
from flashdraft.models.drafter import load_drafter
from flashdraft.models.forward import lm_logits, target_pass
from flashdraft.train.objective import Batch
from tests.export.test_speculators_peer import ANCHORS, TOLERANCE, B, T, move_norms, speculators_pair
from tests.tiny import MASK_ID, tiny_target


def dflash2(target, draft_vocab=None) -> DFlash2Drafter:
    """A DFlash2 drafter whose convolutions and selector are not at their identity / fresh init."""
    d = DFlash2Drafter.for_target(target, num_layers=2, block_size=B, target_layer_ids=[1, 3], mask_token_id=MASK_ID,
                                  seed=1, draft_vocab=draft_vocab, conv_group_size=8, selector_rank=16, selector_top_k=8)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        move_norms(d)
        for name, p in d.named_parameters():
            if "conv" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.2)
    return d


@torch.no_grad()
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_speculators_dflash2_gives_flashdraft_logits_and_selector_scores(tmp_path, monkeypatch, family):
    target = tiny_target(family)
    mine, peer, _ = speculators_pair(tmp_path, target, dflash2(target), DFlash2DraftModel, DFlash2SpeculatorConfig)

    ids = torch.randint(0, 90, (1, T), generator=torch.Generator().manual_seed(0))
    batch = Batch(ids, torch.ones(1, T, dtype=torch.bool), torch.zeros(1, T, dtype=torch.long), torch.arange(T)[None], [0])
    feats, final = target_pass(target, batch, mine.target_layer_ids, want_final=True)
    monkeypatch.setattr(spec_core, "select_anchors", lambda mask, n, b: (ANCHORS, torch.ones(len(ANCHORS), dtype=torch.bool)))
    h_peer, unary_peer, _, _, blocks = peer._backbone_forward(feats, ids, batch.loss_mask.long(), final,
                                                              torch.zeros(1, T, dtype=torch.long), max_anchors=len(ANCHORS))
    h = mine.train_hidden(feats, ids, batch.doc_ids, batch.positions, ANCHORS[None])[0]  # [A, B, d]
    unary = lm_logits(target, h)  # [A, B, vocab]
    assert (unary - unary_peer.view(*unary.shape)).abs().max().item() < TOLERANCE
    cand = unary.topk(mine.top_k, dim=-1).indices  # [A, B, K]
    prev = torch.cat([ids[0, ANCHORS][:, None], ids[0, (ANCHORS[:, None] + torch.arange(1, B - 1))]], dim=1)  # [A, B-1]
    prev = torch.cat([prev[:, :1], prev], dim=1)  # [A, B]: slot 0's own predecessor is unused
    ours = unary.gather(-1, cand) + mine.candidate_selector.transition(h, prev, cand)
    theirs = peer.candidate_selector.score_candidates(unary_peer.view(*unary.shape), h_peer.view(*h.shape), prev, cand)
    assert (ours - theirs).abs().max().item() < TOLERANCE
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_dflash2_export_import_round_trip_is_bit_identical(tmp_path):
    target = tiny_target("qwen3")
    d = dflash2(target)
    d.save_pretrained(tmp_path / "d")
    out = export_drafter(tmp_path / "d", "speculators", tmp_path / "s", target, "org/tiny").out
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dflash2" and cfg["architectures"] == ["DFlash2DraftModel"]
    assert (cfg["conv_kernel_size"], cfg["conv_group_size"], cfg["selector_rank"], cfg["selector_top_k"]) == (2, 8, 16, 8)
    import_drafter(out, tmp_path / "back", target=target)
    back = load_drafter(tmp_path / "back", target)
    assert type(back) is DFlash2Drafter
    mine, theirs = d.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_speculators_export_refuses_a_dflash2_with_a_draft_vocabulary(tmp_path):
    target = tiny_target("qwen3")
    dflash2(target, draft_vocab=torch.arange(3, 60)).save_pretrained(tmp_path / "d")
    with pytest.raises(ExportError, match="whole vocabulary only"):
        export_drafter(tmp_path / "d", "speculators", tmp_path / "s", target, "org/tiny")
    assert not (tmp_path / "s").exists()
