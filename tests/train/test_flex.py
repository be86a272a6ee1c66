"""The flex-attention training path (GPU) against the dense SDPA mask (CPU path), on CPU, forward only.

Every block query sees at least its own slot 0 (full layers: the whole block; sliding layers: causal),
so no query row is ever fully masked, invalid (padding) anchors included: the outputs are compared
on all rows, and no NaN (SDPA) vs 0 (flex) difference can arise.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_mask

import flashdraft.models.dflash.masks as flex
from flashdraft.models.dflash import DFlashDrafter, attend
from flashdraft.models.dflash.masks import training_mask
from flashdraft.models.drafter import DrafterError
from flashdraft.models.forward import target_pass
from flashdraft.train.objective import Batch, block_targets
from tests.tiny import MASK_ID, tiny_target

B = 4
LAYERS = [("full_attention", None), ("sliding_attention", 3)]


def two_rows():
    """Row 0: documents of 9 and 7 tokens packed; row 1: one document of 10 tokens + 6 padding.
    Anchors cover a document start (0, 9: empty context), a block crossing the document boundary (7)
    and padding anchors (row 1 has 2 valid of A = 4)."""
    T = 16
    ids = torch.randint(0, MASK_ID, (2, T), generator=torch.Generator().manual_seed(0))
    doc = torch.tensor([[0] * 9 + [1] * 7, [0] * 10 + [-1] * 6])
    pos = torch.tensor([list(range(9)) + list(range(7)), list(range(10)) + [0] * 6])
    ids[doc < 0] = 0
    batch = Batch(ids, doc >= 0, doc, pos, [0, 1])
    anchors = torch.tensor([[0, 7, 9, 13], [2, 6, 0, 0]])
    valid = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    return batch, block_targets(batch, anchors, valid, B, gamma=4.0)


@pytest.mark.parametrize("layer_type,window", LAYERS)
def test_flex_mask_equals_dense_mask(layer_type, window):
    batch, bl = two_rows()
    dense = training_mask(bl.anchors, batch.doc_ids, batch.positions, B, layer_type, window)  # [b, 1, A*B, T + A*B]
    bm = flex.flex_training_mask(bl.anchors, batch.doc_ids, batch.positions, B, layer_type, window)
    assert isinstance(bm, BlockMask)
    b, _, q, kv = dense.shape
    assert bm.shape == (b, 1, q, kv)
    # the mask_mod evaluated on every (row, q, kv), exactly as create_block_mask evaluates it
    assert torch.equal(create_mask(bm.mask_mod, b, 1, q, kv, device="cpu"), dense)
    assert dense.any(-1).all()  # no fully masked query row (see the module docstring)


def test_sliding_flex_mask_needs_a_window():
    batch, bl = two_rows()
    with pytest.raises(DrafterError, match="sliding_window"):
        flex.flex_training_mask(bl.anchors, batch.doc_ids, batch.positions, B, "sliding_attention", None)


@pytest.mark.parametrize("kv_heads", [2, 4])  # GQA (4 query heads on 2 kv heads) and plain MHA
@pytest.mark.parametrize("layer_type,window", LAYERS)
def test_flex_attend_equals_sdpa_with_dense_mask(layer_type, window, kv_heads):
    batch, bl = two_rows()
    b, A = bl.anchors.shape
    T = batch.input_ids.shape[1]
    g = torch.Generator().manual_seed(1)
    q = torch.randn(b, 4, A * B, 8, generator=g)  # [b, heads, A*B, hd]
    k = torch.randn(b, kv_heads, T + A * B, 8, generator=g)  # [b, kv_heads, T + A*B, hd]
    v = torch.randn(b, kv_heads, T + A * B, 8, generator=g)
    gqa = kv_heads != 4
    ref = attend(q, k, v, training_mask(bl.anchors, batch.doc_ids, batch.positions, B, layer_type, window), gqa)
    out = attend(q, k, v, flex.flex_training_mask(bl.anchors, batch.doc_ids, batch.positions, B, layer_type, window), gqa)
    assert out.shape == ref.shape == (b, 4, A * B, 8)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family,layer_types", [("qwen3", None), ("gemma3", ["sliding_attention", "full_attention"])])
def test_drafter_hidden_with_flex_masks_equals_dense(monkeypatch, family, layer_types):
    target = tiny_target(family)
    d = DFlashDrafter.for_target(target, num_layers=2, block_size=B, target_layer_ids=[1, 3], mask_token_id=MASK_ID)
    if layer_types:
        d.cfg.layer_types, d.cfg.sliding_window = layer_types, 3
        for layer, lt in zip(d.layers, layer_types):
            layer.layer_type = lt
    batch, bl = two_rows()
    feats, _ = target_pass(target, batch, d.target_layer_ids, want_final=False)
    with torch.no_grad():  # flex has no backward on CPU
        ref = d.train_hidden(feats, batch.input_ids, batch.doc_ids, batch.positions, bl.anchors)  # [b, A, B, d], dense masks + SDPA
        calls = []
        real = flex.flex_attend
        monkeypatch.setattr(flex, "flex_attend", lambda *a: calls.append(1) or real(*a))
        out = d.train_hidden(feats, batch.input_ids, batch.doc_ids, batch.positions, bl.anchors, attention="flex")
    assert len(calls) == len(d.layers)  # every layer went through flex
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_flex_available_means_a_cuda_gpu():
    assert flex.flex_available() is torch.cuda.is_available()
