"""The training forward against the inference step, masks and labels on hand-checked cases."""

from __future__ import annotations

import pytest
import torch

from flashdraft.models.dflash import DFlashDrafter
from flashdraft.models.dflash.masks import training_mask
from flashdraft.models.forward import lm_logits, target_pass
from flashdraft.train.objective import (
    Batch,
    Blocks,
    DFlashObjective,
    TrainError,
    anchor_candidates,
    block_targets,
)
from tests.tiny import MASK_ID, tiny_target


def one_row(ids, mask, doc=None, seed=0) -> Batch:
    T = len(ids)
    doc = torch.tensor(doc if doc is not None else [0] * T)
    pos = torch.zeros(T, dtype=torch.long)
    for d in doc.unique():
        sel = doc == d
        pos[sel] = torch.arange(int(sel.sum()))
    return Batch(torch.tensor([ids]), torch.tensor([mask], dtype=torch.bool), doc[None], pos[None], [seed])


def blocks_at(batch: Batch, anchors: list[int], B: int, gamma: float = 4.0) -> Blocks:
    a = torch.tensor([anchors])
    return block_targets(batch, a, torch.ones_like(a, dtype=torch.bool), B, gamma)


def test_anchor_needs_supervision_at_t_and_t_plus_1_and_same_document():
    mask = torch.tensor([0, 1, 1, 1, 0, 1, 1, 1], dtype=torch.bool)
    doc = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
    assert anchor_candidates(mask, doc).nonzero().flatten().tolist() == [1, 2, 5, 6]
    doc2 = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1])  # 2 -> 3 crosses documents
    assert anchor_candidates(mask, doc2).nonzero().flatten().tolist() == [1, 5, 6]


def test_labels_same_position_and_weights():
    ids = list(range(10, 20))
    batch = one_row(ids, [0, 0, 1, 1, 1, 1, 1, 0, 1, 1])
    bl = blocks_at(batch, [2, 8], B=4, gamma=2.0)
    # slot k of the block anchored at t predicts the token at t + k
    assert bl.labels[0, 0].tolist() == [12, 13, 14, 15]
    w = bl.weights[0]
    assert w[0, 0] == 0  # slot 0 unweighted
    torch.testing.assert_close(w[0, 1:], torch.exp(-torch.arange(3.0) / 2.0))
    # anchor 8: slot 1 -> 9 supervised; slots 2, 3 past the end -> 0
    assert w[1, 1] == 1 and w[1, 2] == 0 and w[1, 3] == 0
    bl2 = blocks_at(batch, [5], B=4)
    assert bl2.weights[0, 0].tolist()[2] == 0  # position 7 is outside the loss mask
    assert bl2.weights[0, 0, 3] > 0  # position 8 is supervised again


def test_mask_strict_anchor_block_isolation_and_documents():
    batch = one_row(list(range(8)), [1] * 8, doc=[0, 0, 0, 0, 1, 1, 1, 1])
    bl = blocks_at(batch, [2, 5], B=2)
    m = training_mask(bl.anchors, batch.doc_ids, batch.positions, 2, "full_attention", None)[0, 0]  # [A*B, T + A*B]
    assert m.shape == (4, 8 + 4)
    ctx, blk = m[:, :8].int(), m[:, 8:].int()
    # block at 2 sees kv 0, 1 (strictly before 2); block at 5 sees kv 4 only (doc 1, before 5)
    assert ctx.tolist() == [[1, 1, 0, 0, 0, 0, 0, 0]] * 2 + [[0, 0, 0, 0, 1, 0, 0, 0]] * 2
    assert blk.tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]
    # sliding layers: causal inside the block and windowed in document positions
    s = training_mask(bl.anchors, batch.doc_ids, batch.positions, 2, "sliding_attention", 2)[0, 0].int()
    assert s[:, 8:].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    assert s[0, :8].tolist() == [0, 1, 0, 0, 0, 0, 0, 0]  # q pos 2 sees pos 1 only (2 - 0 >= window)
    assert s[3, :8].tolist() == [0] * 8  # doc-1 block slot 1 at doc position 2: kv doc-position 0 is out of window


def drafter_for(target, layer_types=None, B=4, seed=1):
    d = DFlashDrafter.for_target(target, num_layers=2, block_size=B, target_layer_ids=[1, 3], mask_token_id=MASK_ID, seed=seed)
    if layer_types:
        d.cfg.layer_types, d.cfg.sliding_window = layer_types, 3
        for layer, lt in zip(d.layers, layer_types):
            layer.layer_type = lt
    return d


@pytest.mark.parametrize("family,layer_types", [("qwen3", None), ("gemma3", ["sliding_attention", "full_attention"])])
def test_training_forward_equals_inference_propose(family, layer_types):
    target = tiny_target(family)
    d = drafter_for(target, layer_types)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, MASK_ID, (14,), generator=g).tolist()
    batch = one_row(ids, [1] * 14)
    anchors = [0, 3, 9, 12]
    bl = blocks_at(batch, anchors, B=4)
    feats, _ = target_pass(target, batch, d.target_layer_ids, want_final=False)
    with torch.no_grad():
        h = d.train_hidden(feats, batch.input_ids, batch.doc_ids, batch.positions, bl.anchors)  # [1, A, B, d]
    for i, t in enumerate(anchors):
        d.reset()
        ref = d.propose(torch.tensor(ids[: t + 1]), feats[0, :t] if t else None)  # [B-1, V]
        torch.testing.assert_close(lm_logits(target, h[0, i, 1:]), ref, rtol=1e-4, atol=1e-4)


def test_packed_rows_equal_separate_rows():
    target = tiny_target("qwen3")
    d = drafter_for(target)
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(0, MASK_ID, (7,), generator=g).tolist(), torch.randint(0, MASK_ID, (9,), generator=g).tolist()
    packed = one_row(a + b, [1] * 16, doc=[0] * 7 + [1] * 9)
    pa, pb = one_row(a, [1] * 7), one_row(b, [1] * 9)
    fp, _ = target_pass(target, packed, d.target_layer_ids, False)
    fa, _ = target_pass(target, pa, d.target_layer_ids, False)
    fb, _ = target_pass(target, pb, d.target_layer_ids, False)
    torch.testing.assert_close(fp[0], torch.cat([fa[0], fb[0]]), rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        hp = d.train_hidden(fp, packed.input_ids, packed.doc_ids, packed.positions, blocks_at(packed, [2, 10], B=4).anchors)
        ha = d.train_hidden(fa, pa.input_ids, pa.doc_ids, pa.positions, blocks_at(pa, [2], B=4).anchors)
        hb = d.train_hidden(fb, pb.input_ids, pb.doc_ids, pb.positions, blocks_at(pb, [3], B=4).anchors)
    torch.testing.assert_close(hp[0, 0], ha[0, 0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(hp[0, 1], hb[0, 0], rtol=1e-4, atol=1e-5)


def test_loss_backward_chunked_equals_unchunked_and_kl_runs():
    target = tiny_target("gemma3")
    d = drafter_for(target)
    ids = torch.randint(0, MASK_ID, (20,), generator=torch.Generator().manual_seed(2)).tolist()
    batch = one_row(ids, [0] * 4 + [1] * 16)
    grads = []
    for chunk in (3, 1000):
        obj = DFlashObjective(d, max_anchors=5, lm_head_chunk=chunk)
        bl = obj.blocks(batch)
        d.zero_grad()
        out = obj(batch, bl, bl.weight_sum)
        out.loss.backward()
        grads.append(d.fc.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)
    assert bl.valid.sum() == 5 and (bl.anchors[bl.valid] >= 4).all()
    kl = DFlashObjective(d, max_anchors=5, loss="kl")
    out = kl(batch, bl, bl.weight_sum)
    assert torch.isfinite(out.loss) and out.loss > 0


def test_unbound_or_nan_drafter_raises():
    target = tiny_target("qwen3")
    d = drafter_for(target)
    batch = one_row(list(range(12)), [1] * 12)
    obj = DFlashObjective(d, max_anchors=4)
    with torch.no_grad():
        d.fc.weight.fill_(float("nan"))
    with pytest.raises(TrainError, match="non-finite loss"):
        obj(batch, obj.blocks(batch), 1.0)
    d._target = None
    with pytest.raises(TrainError, match="not bound"):
        obj(batch, obj.blocks(batch), 1.0)


def test_lm_head_checkpointing_and_bf16_autocast_paths():
    target = tiny_target("gemma3")
    d = drafter_for(target)
    ids = torch.randint(0, MASK_ID, (16,), generator=torch.Generator().manual_seed(3)).tolist()
    batch = one_row(ids, [0] * 3 + [1] * 13)
    grads, losses = [], []
    for ckpt in (True, False):
        obj = DFlashObjective(d, max_anchors=4, lm_head_chunk=5, checkpoint_lm_head=ckpt)
        bl = obj.blocks(batch)
        d.zero_grad()
        out = obj(batch, bl, bl.weight_sum)
        out.loss.backward()
        grads.append(d.fc.weight.grad.clone())
        losses.append(float(out.loss.detach()))
    assert losses[0] == losses[1]
    torch.testing.assert_close(grads[0], grads[1])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out16 = DFlashObjective(d, max_anchors=4)(batch, bl, bl.weight_sum)
    assert out16.loss.dtype == torch.float32 and abs(float(out16.loss.detach()) - losses[0]) < 0.05 * losses[0]


def test_sampled_vocabulary_loss_covers_the_labels():
    target = tiny_target("qwen3")
    d = drafter_for(target)
    ids = torch.randint(0, MASK_ID, (16,), generator=torch.Generator().manual_seed(4)).tolist()
    batch = one_row(ids, [0] * 3 + [1] * 13)
    full = DFlashObjective(d, max_anchors=4)
    bl = full.blocks(batch)
    ref = float(full(batch, bl, bl.weight_sum).loss.detach())
    everything = DFlashObjective(d, max_anchors=4, loss_vocab=100_000)  # negatives cover the whole tiny vocabulary
    assert float(everything(batch, bl, bl.weight_sum).loss.detach()) == pytest.approx(ref, rel=1e-5)
    few = DFlashObjective(d, max_anchors=4, loss_vocab=4)
    out = few(batch, bl, bl.weight_sum)
    assert 0 < float(out.loss.detach()) < ref  # fewer competitors: a smaller CE
    out.loss.backward()
    with pytest.raises(TrainError, match="loss 'ce' only"):
        DFlashObjective(d, loss="kl", loss_vocab=8)


def test_final_norm_starts_at_the_targets_effective_scale():
    from flashdraft.train.objective import init_norm_from_target

    for family, offset in (("gemma3", 1.0), ("qwen3", 0.0)):
        target = tiny_target(family)
        with torch.no_grad():
            target.model.model.norm.weight.uniform_(0.5, 2.0)
        d = drafter_for(target)
        init_norm_from_target(d, target)
        want = target.model.model.norm.weight + offset
        torch.testing.assert_close(d.norm.weight, want / want.abs().mean())
