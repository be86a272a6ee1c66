"""Held against a peer: speculators 0.9's own DFlash model class, loaded from ``flashdraft export --to speculators``,
gives flashdraft's block logits and greedy drafts for the same target features, block ids and positions.

speculators is installed beside the project without its dependencies (``scripts/setup_env.sh``; its import needs
only loguru and pydantic-settings here). Its training forward ``_backbone_forward`` opens the blocks at anchors
it draws itself (``select_anchors``); the test hands both models the same anchors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import speculators.models.dflash.core as spec_core
import torch
from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig

from flashdraft.export.formats import SPECULATORS_VERSION, export_drafter
from flashdraft.models.dflash import DFlashDrafter
from flashdraft.models.drafter import load_drafter
from flashdraft.models.forward import lm_logits, target_pass
from flashdraft.train.objective import Batch
from tests.tiny import MASK_ID, tiny_target

B, T = 4, 24
ANCHORS = torch.tensor([3, 7, 12, 18])
TOLERANCE = 1e-5  # fp32 block logits, largest absolute difference (measured: 5e-7 .. 1.5e-6)


@torch.no_grad()
def move_norms(drafter) -> None:
    """Move every norm weight (the 1-D parameters) off 1, seeded, so a norm read wrongly shows."""
    for p in drafter.parameters():
        if p.ndim == 1:
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.1)


def speculators_pair(tmp: Path, target, drafter, peer_class, config_class):
    """``drafter`` saved and exported --to speculators (the target saved as the verifier speculators reads) -> (the
    drafter as flashdraft loads it, the export as speculators' ``peer_class`` loads it with eager attention, the
    export folder)."""
    target.model.save_pretrained(tmp / "verifier")  # what speculators reads the verifier's weights from
    drafter.save_pretrained(tmp / "flashdraft")
    out = export_drafter(tmp / "flashdraft", "speculators", tmp / "speculators", target, str(tmp / "verifier")).out
    cfg = config_class.from_pretrained(out)
    cfg.transformer_layer_config._attn_implementation = "eager"  # flex attention's block mask wants a GPU compile
    peer = peer_class.from_pretrained(out, config=cfg).float().eval()
    return load_drafter(tmp / "flashdraft", target).float().eval(), peer, out


def exported_pair(tmp: Path, family: str, draft_vocab: torch.Tensor | None):
    """A flashdraft drafter (:func:`move_norms`) and its export as speculators' DFlashDraftModel loads it -> (the
    target, the drafter, the peer, the export folder)."""
    target = tiny_target(family)
    d = DFlashDrafter.for_target(target, num_layers=2, block_size=B, target_layer_ids=[1, 3], mask_token_id=MASK_ID,
                                 seed=1, draft_vocab=draft_vocab)
    move_norms(d)
    return target, *speculators_pair(tmp, target, d, DFlashDraftModel, DFlashSpeculatorConfig)


@torch.no_grad()
def block_logits(target, mine, peer, monkeypatch):
    """Both models' logits for the blocks opened at ANCHORS of one sequence -> ([A, B, Vd], [A, B, Vd])."""
    ids = torch.randint(0, 90, (1, T), generator=torch.Generator().manual_seed(0))
    batch = Batch(ids, torch.ones(1, T, dtype=torch.bool), torch.zeros(1, T, dtype=torch.long), torch.arange(T)[None], [0])
    feats, final = target_pass(target, batch, mine.target_layer_ids, want_final=True)  # [1, T, K * H], [1, T, H]
    monkeypatch.setattr(spec_core, "select_anchors", lambda mask, n, b: (ANCHORS, torch.ones(len(ANCHORS), dtype=torch.bool)))
    _, theirs, *_ = peer._backbone_forward(feats, ids, batch.loss_mask.long(), final, torch.zeros(1, T, dtype=torch.long),
                                           max_anchors=len(ANCHORS))  # [1, A * B, Vd]
    h = mine.train_hidden(feats, ids, batch.doc_ids, batch.positions, ANCHORS[None])[0]  # [A, B, d]
    ours = mine.lm_head(h) if mine.vocab is not None else lm_logits(target, h)
    return ours, theirs.view(*ours.shape)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_speculators_model_gives_flashdraft_block_logits_and_drafts(tmp_path, monkeypatch, family, vocab):
    draft_vocab = torch.arange(3, 60) if vocab == "reduced" else None
    target, mine, peer, _ = exported_pair(tmp_path, family, draft_vocab)
    ours, theirs = block_logits(target, mine, peer, monkeypatch)
    assert (ours - theirs).abs().max().item() < TOLERANCE
    drafts = ours.argmax(-1)[:, 1:]  # [A, B - 1] the greedy drafts (slot 0 holds the anchor)
    peer_drafts = theirs.argmax(-1)[:, 1:]
    if draft_vocab is not None:  # draft ids -> target ids through each side's own d2t
        drafts, peer_drafts = mine.vocab.to_target_ids(drafts), peer_drafts + peer.d2t[peer_drafts]
    assert torch.equal(drafts, peer_drafts)


def test_speculators_replaces_a_scaled_embedding_with_the_verifiers_raw_rows(tmp_path, monkeypatch):
    """Gemma scales its embedding rows by sqrt(hidden) inside the module. The export ships the scaled table, but
    speculators 0.9's from_pretrained overwrites embed_tokens with the verifier's raw rows, so its class drafts
    from unscaled embeddings; with the shipped table put back it gives flashdraft's logits."""
    target, mine, peer, out = exported_pair(tmp_path, "gemma3", torch.arange(3, 60))
    emb = target.model.get_input_embeddings()
    raw = emb.weight.detach().float()
    assert torch.equal(peer.embed_tokens.weight, raw)
    ours, theirs = block_logits(target, mine, peer, monkeypatch)
    assert (ours - theirs).abs().max().item() > 100 * TOLERANCE
    with torch.no_grad():
        peer.embed_tokens.weight.copy_(emb(torch.arange(raw.shape[0])))  # the table the export ships
    ours, theirs = block_logits(target, mine, peer, monkeypatch)
    assert (ours - theirs).abs().max().item() < TOLERANCE


def test_exports_record_the_installed_speculators_version(tmp_path):
    from importlib.metadata import version

    out = exported_pair(tmp_path, "qwen3", None)[3]
    assert json.loads((out / "config.json").read_text())["speculators_version"] == version("speculators") == SPECULATORS_VERSION


def greedy_sequence(target, n_prompt: int = 6, n_new: int = 18) -> tuple[torch.Tensor, torch.Tensor]:
    """A random prompt and the target's greedy continuation (so the data token is the target's argmax, the label
    speculators' CE takes) -> ids [1, T], loss mask [1, T] (the continuation)."""
    from tests.tiny import hf_greedy, random_prompts

    prompt = random_prompts(1, n_prompt, seed=5)[0]
    ids = prompt + hf_greedy(target, prompt, n_new)
    return torch.tensor([ids]), torch.tensor([[0] * n_prompt + [1] * n_new], dtype=torch.bool)


def prenorm_final(target, ids: torch.Tensor) -> torch.Tensor:
    """The target's last hidden state before its final norm [1, T, H] (speculators applies the norm itself)."""
    seen = {}
    norm = target.model.get_decoder().norm
    handle = norm.register_forward_hook(lambda mod, args, out: seen.setdefault("h", args[0].detach()))
    with torch.no_grad():
        target.model(input_ids=ids)
    handle.remove()
    return seen["h"]


@pytest.mark.parametrize("loss,weights,vocab", [("kl", "decay", "full"), ("kl", "decay", "reduced"),
                                                ("ce", "decay", "full"), ("ce", "dpace", "full")])
def test_objective_matches_speculators_loss_and_gradients(tmp_path, monkeypatch, loss, weights, vocab):
    """Same batch, same anchors: flashdraft's DFlash objective with speculators' normaliser (``loss_normaliser:
    slots``) gives speculators' loss value and the same gradients (every drafter weight both train)."""
    from speculators.losses import resolve_loss_config

    import flashdraft.train.objective as fobj

    target = tiny_target("qwen3")
    ids, mask = greedy_sequence(target)
    draft_vocab = torch.unique(torch.cat([ids[0], torch.arange(40, 70)])) if vocab == "reduced" else None
    _, mine, peer, _ = exported_pair(tmp_path, "qwen3", draft_vocab)
    mine.train(), peer.train()
    gamma = 4.0
    T = ids.shape[1]
    batch = Batch(ids, mask, torch.zeros(1, T, dtype=torch.long), torch.arange(T)[None], [0])
    anchors = torch.tensor([6, 9, 13, 16])  # supervised, at least B from the end (both sides' candidate rules)
    monkeypatch.setattr(fobj, "sample_anchors", lambda b, n: (anchors[None], torch.ones(1, len(anchors), dtype=torch.bool)))
    monkeypatch.setattr(spec_core, "select_anchors", lambda m, n, b: (anchors, torch.ones(len(anchors), dtype=torch.bool)))
    objective = fobj.DFlashObjective(mine, max_anchors=len(anchors), gamma=gamma, loss=loss, position_weights=weights,
                                     loss_normaliser="slots", lm_head_chunk=1024)
    with torch.no_grad():
        feats, final = target_pass(target, batch, mine.target_layer_ids, want_final=True)
    blocks = objective.blocks(batch)
    ours = objective(batch, blocks, blocks.norm, feats, final).loss
    ours.backward()
    _, theirs, _ = peer(feats, ids, mask.long(), prenorm_final(target, ids), torch.zeros(1, T, dtype=torch.long),
                        loss_config=resolve_loss_config("kl_div" if loss == "kl" else "ce", "eager"), gamma=gamma,
                        max_anchors=len(anchors), per_position_loss_weight="dpace" if weights == "dpace" else "fixed-exp-decay")
    theirs.backward()
    assert abs(ours.item() - theirs.item()) < 1e-5 * max(1.0, abs(theirs.item()))
    peer_grads = dict(peer.named_parameters())
    compared = 0
    for name, p in mine.named_parameters():
        if p.grad is None or name not in peer_grads or peer_grads[name].grad is None:
            continue
        torch.testing.assert_close(p.grad, peer_grads[name].grad, rtol=1e-4, atol=1e-6)
        compared += 1
    assert compared >= 10  # fc, norms, attention and MLP of both layers


@pytest.mark.parametrize("family", ["qwen3", "llama", "gemma3"])
def test_speculators_eagle3_model_gives_flashdraft_logits_at_every_step(tmp_path, family):
    """EAGLE-3 exported --to speculators, loaded by speculators' Eagle3DraftModel: the same draft logits and drafts
    as flashdraft's training-time-test unroll at each of 3 steps (step k fed the data's tokens k + 1 ahead)."""
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.models.eagle3.config import Eagle3SpeculatorConfig

    from flashdraft.models.eagle3 import Eagle3Drafter
    from flashdraft.models.eagle3.ttt import ttt_forward

    target = tiny_target(family)
    d = Eagle3Drafter.for_target(target, target_layer_ids=[1, 2, 3], draft_vocab=torch.arange(3, 60), max_depth=3, seed=1)
    move_norms(d)
    mine, peer, _ = speculators_pair(tmp_path, target, d, Eagle3DraftModel, Eagle3SpeculatorConfig)
    ids = torch.randint(0, 90, (1, T), generator=torch.Generator().manual_seed(0))
    batch = Batch(ids, torch.ones(1, T, dtype=torch.bool), torch.zeros(1, T, dtype=torch.long), torch.arange(T)[None], [0])
    caught = []
    hook = peer.lm_head.register_forward_hook(lambda mod, args, out: caught.append(out.detach()))
    with torch.no_grad():
        feats, _ = target_pass(target, batch, mine.target_layer_ids, want_final=False)
        # speculators feeds step 0 the ids it is given (position i: token i + 1), then shifts them itself
        peer_drafts = peer(feats, torch.cat([ids[:, 1:], ids.new_zeros(1, 1)], 1), torch.zeros(1, T, dtype=torch.long),
                           ttt_steps=3)
        outs = ttt_forward(mine, feats, ids, batch.doc_ids, batch.positions, 3)  # [3, 1, T, d]
    hook.remove()
    for k in range(3):
        n = T - 1 - k  # positions whose step-k input is a real token on both sides (the ends pad differently)
        ours = mine.draft_logits(outs[k])[0, :n]  # [n, Vd]
        assert (ours - caught[k][0, :n]).abs().max().item() < TOLERANCE
        assert torch.equal(ours.argmax(-1), peer_drafts[k][0, :n])
