"""Visibility of the DFlash training forward: a dense bool mask (SDPA, the CPU path and the reference)
and the same rule as a FlexAttention ``BlockMask`` (the GPU path).

Per row, anchors [b, A] open blocks of B slots at positions anchor .. anchor + B - 1. A block's
queries see the context of their own document strictly before the anchor, and their own block
(bidirectionally; sliding-window layers: causal inside the block, plus the window), never another
block or another packed document. The kv axis is the T context positions, then the A*B block slots.

Most of the dense mask is empty, so on GPUs :func:`flex_training_mask` states the rule as a
``mask_mod`` over small per-row tensors and ``create_block_mask`` turns it into a block-sparse
``BlockMask``; :func:`flex_attend` runs the fused kernel, which skips the empty tiles.
:func:`flashdraft.models.dflash.attend` dispatches here when it is given a ``BlockMask``.

CPU: torch has no FlexAttention backward on CPU (it raises NotImplementedError for inputs that need
grad), so CPU training keeps SDPA + the dense mask and flex runs there forward-only, for parity
checks. It runs eagerly: ``torch.compile(flex_attention)`` compiles on CPU with inductor + gcc
(torch 2.13, tiny case: ~22 s cold, ~4 s warm, vs ~0.8 s for the first eager call; then ~0.9 ms vs
~7 ms per call), but its dynamic-shape recompile (a second T or A) fails with a C++ compile error.
"""

from __future__ import annotations

import warnings

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from flashdraft.models.drafter import DrafterError

_compiled_flex = None  # torch.compile(flex_attention), built on the first CUDA call


def _need_window(layer_type: str, window: int | None) -> bool:
    sliding = layer_type == "sliding_attention"
    if sliding and not window:
        raise DrafterError("a sliding_attention drafter layer needs cfg.sliding_window; set it in the drafter config")
    return sliding


def training_mask(anchors: torch.Tensor, doc_ids: torch.Tensor, positions: torch.Tensor, block_size: int,
                  layer_type: str, window: int | None) -> torch.Tensor:
    """Visibility for the block queries -> bool [b, 1, A*B, T + A*B] (True = visible).

    anchors: [b, A] long; doc_ids: [b, T] long (-1 = padding); positions: [b, T] long (inside its document).
    """
    a, B = anchors, block_size
    b, A = a.shape
    T = doc_ids.shape[1]
    dev = a.device
    k = torch.arange(B, device=dev)
    kv = torch.arange(T, device=dev)
    anchor_doc = doc_ids.gather(1, a)  # [b, A]
    anchor_pos = positions.gather(1, a)  # [b, A]
    # context: same document, strictly before the anchor  -> [b, A, B, T]
    ctx = (kv[None, None, :] < a[..., None]) & (doc_ids[:, None, :] == anchor_doc[..., None])
    ctx = ctx[:, :, None, :].expand(b, A, B, T)
    # own block only -> [b, A, B, A, B]
    same_block = torch.eye(A, dtype=torch.bool, device=dev)[None, :, None, :, None]
    blk = same_block.expand(b, A, B, A, B)
    if _need_window(layer_type, window):
        q_pos = anchor_pos[..., None] + k  # [b, A, B]
        rel_ctx = q_pos[..., None] - positions[:, None, None, :]  # [b, A, B, T]
        ctx = ctx & (rel_ctx < window)
        rel_blk = k[:, None] - k[None, :]  # [B(q), B(kv)]
        blk = blk & ((rel_blk >= 0) & (rel_blk < window))[None, None, :, None, :]
    mask = torch.cat([ctx.reshape(b, A * B, T), blk.reshape(b, A * B, A * B)], dim=-1)
    return mask[:, None]  # [b, 1, A*B, T + A*B]


def flex_available() -> bool:
    """Whether the flex path can train here: FlexAttention needs a CUDA GPU for its backward."""
    return torch.cuda.is_available()


def flex_training_mask(anchors: torch.Tensor, doc_ids: torch.Tensor, positions: torch.Tensor, block_size: int,
                       layer_type: str, window: int | None) -> BlockMask:
    """The visibility of :func:`training_mask` as a ``BlockMask`` (batch b, any head, q = A*B block
    slots, kv = T context positions then the A*B block slots)."""
    B = block_size
    a, doc, pos = anchors, doc_ids, positions  # [b, A], [b, T], [b, T]
    b, A = a.shape
    T = doc.shape[1]
    anchor_doc = doc.gather(1, a)  # [b, A]
    anchor_pos = pos.gather(1, a)  # [b, A]
    sliding = _need_window(layer_type, window)

    def mask_mod(bi, h, q_idx, kv_idx):
        A, T = a.shape[1], doc.shape[1]  # from the tensors, not closed-over ints: no recompiles as they vary
        blk_q = (q_idx // B).clamp(max=A - 1)  # the query's block (anchor index); clamp: kernels may pad q
        k = q_idx % B  # the query's slot in its block
        c = kv_idx.clamp(max=T - 1)  # kv as a context position (used only where kv_idx < T)
        j = (kv_idx - T).clamp(min=0)  # kv as a block slot index in [0, A*B) (used only where kv_idx >= T)
        ctx = (kv_idx < T) & (c < a[bi, blk_q]) & (doc[bi, c] == anchor_doc[bi, blk_q])
        blk = (kv_idx >= T) & (j // B == blk_q)  # own block only
        if sliding:
            ctx = ctx & (anchor_pos[bi, blk_q] + k - pos[bi, c] < window)  # window in document positions
            rel = k - j % B
            blk = blk & (rel >= 0) & (rel < window)  # causal + window inside the block
        return ctx | blk

    return create_block_mask(mask_mod, B=b, H=None, Q_LEN=A * B, KV_LEN=T + A * B, device=a.device)


def flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: BlockMask, gqa: bool) -> torch.Tensor:
    """Attention of q [b, h, q, hd] over k, v [b, kv_heads, n, hd] under ``block_mask`` -> [b, h, q, hd].

    Compiled once per process on CUDA (torch.compile re-specialises by itself when shapes change);
    eager elsewhere (forward only on CPU, see the module docstring). A query that sees nothing gets 0.
    """
    global _compiled_flex
    if q.device.type == "cuda":
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention)
        return _compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=gqa)
    with warnings.catch_warnings():  # eager on purpose: silence torch's "called without torch.compile()"
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)
