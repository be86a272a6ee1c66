"""One target forward over new tokens with an explicit visibility pattern, and KV-cache surgery.

Every decoder (AR, DFlash chain, DDTree) verifies through :func:`target_forward`: new tokens carry
explicit position ids (depth-based for trees, so siblings share a position) and a boolean
visibility matrix among themselves (causal for a chain, ancestor-only for a tree); the whole
cached past is visible, subject to each layer's sliding window. The cache keeps every layer's
full K/V (an HF ``DynamicCache`` without config): windows are enforced by the mask, so cropping
and compaction after a rejected draft never lose a token a sliding layer still needs.

Hybrid targets (recurrent layers, see :mod:`flashdraft.models.recurrent`) use a :class:`HybridCache`
(``new_cache(target)``); a tree forward passes ``tree_parents`` so each node's recurrent state comes
from its parent, and :func:`compact_cache` then keeps the state of the accepted path's last node.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager, nullcontext
from typing import Protocol

import torch
from torch import nn
from transformers import DynamicCache

from flashdraft.models.recurrent import (
    NON_ATTENTION_LAYER_TYPES,
    HybridCache,
    RecurrentError,
    commit,
    is_recurrent_layer,
    recurrent_family,
    tree_mixers,
)
from flashdraft.models.target import Target
from flashdraft.timing import median_ms


def new_cache(target: Target | None = None) -> DynamicCache:
    """A cache of full (non-sliding) layers: crop and compaction stay exact for every layer type.
    A hybrid target (recurrent layers) gets a :class:`HybridCache`; pass the target to get it."""
    if target is not None and recurrent_family(target.config) is not None:
        return HybridCache(target.config)
    return DynamicCache()


def cache_length(cache: DynamicCache) -> int:
    return int(cache.get_seq_length())


def attention_masks(config, q_pos: torch.Tensor, k_pos: torch.Tensor, visible: torch.Tensor, dtype: torch.dtype):
    """Additive masks per layer type, shaped [1, 1, n_q, n_k] (or [b, 1, n_q, n_k] for batched inputs).

    q_pos: [(b,) n_q] absolute positions of the queries; k_pos: [(b,) n_k] positions of all keys (past + new);
    visible: [(b,) n_q, n_k] bool, which keys each query may see before windows are applied.
    Returns a dict {layer_type: mask} for models with ``layer_types`` (Gemma3, Qwen3, ...), else one mask.
    """
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)

    def additive(allow: torch.Tensor) -> torch.Tensor:
        m = torch.zeros(allow.shape, dtype=dtype, device=allow.device).masked_fill_(~allow, torch.finfo(dtype).min)
        return m[None, None] if m.dim() == 2 else m[:, None]  # [1 or b, 1, n_q, n_k]

    def windowed(allow: torch.Tensor) -> torch.Tensor:
        # HF sliding-window semantics: query at q sees key at k iff q - k < window.
        return allow & ((q_pos[..., :, None] - k_pos[..., None, :]) < window)

    if not layer_types:
        return additive(windowed(visible) if window else visible)
    masks = {}
    for lt in set(layer_types):
        if lt in NON_ATTENTION_LAYER_TYPES:  # recurrent / MLP blocks of hybrids take no attention mask
            masks[lt] = None
            continue
        masks[lt] = additive(windowed(visible) if (lt == "sliding_attention" and window) else visible)
    return masks


@contextmanager
def capture_layer_outputs(target: Target, layer_ids: list[int]):
    """Collect the outputs of decoder layers ``layer_ids`` (= HF hidden_states[i + 1]) during a forward.

    Yields a list that, after the forward, holds one [batch, seq, hidden] tensor per id, in order.
    """
    outputs: dict[int, torch.Tensor] = {}
    handles = []
    for i in layer_ids:

        def hook(_module, _inputs, output, i=i):
            outputs[i] = output[0] if isinstance(output, tuple) else output

        handles.append(target.decoder_layers[i].register_forward_hook(hook))
    result: list[torch.Tensor] = []
    try:
        yield result
    finally:
        for h in handles:
            h.remove()
    result.extend(outputs[i] for i in layer_ids)


@torch.no_grad()
def target_forward(
    target: Target,
    cache: DynamicCache,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    visible_new: torch.Tensor,
    layer_ids: list[int] | None = None,
    tree_parents: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the target body on new tokens appended to ``cache``.

    input_ids, positions: [n]; visible_new: [n, n] bool among the new tokens.
    tree_parents: [n] parent of each new token (-1 for the root) when the tokens are a draft tree (or
    chain) to verify. Hybrid targets need it for any forward that is compacted afterwards: their
    recurrent layers then run each node from its parent's state. Without it the new tokens must be
    causal and are committed to the recurrent state as they are (a prefill). Pure-attention targets
    ignore it (the visibility mask already isolates branches).
    Returns (final-normed hidden states [n, hidden], concatenated features [n, len(layer_ids) * hidden] or None).
    The cache grows by n; the caller crops or compacts it once it knows what was accepted.
    """
    past = cache_length(cache)
    n = input_ids.shape[0]
    dev = input_ids.device
    k_pos = torch.cat([torch.arange(past, device=dev), positions])  # [past + n]
    visible = torch.cat([torch.ones(n, past, dtype=torch.bool, device=dev), visible_new], dim=1)  # [n, past + n]
    masks = attention_masks(target.config, positions, k_pos, visible, target.dtype)
    hybrid = isinstance(cache, HybridCache)
    if not hybrid and recurrent_family(target.config) is not None:
        raise RecurrentError(f"{target.name} is a hybrid (recurrent) target: create its cache with new_cache(target)")
    if hybrid and tree_parents is None:
        if not torch.equal(visible_new, torch.ones(n, n, dtype=torch.bool, device=dev).tril()):
            raise RecurrentError("a hybrid target verifies a tree only with tree_parents=[parent of each token]")
        cache.pending, cache.pending_parents = {}, None
    recurrent = tree_mixers(target, cache, tree_parents) if hybrid and tree_parents is not None else nullcontext()
    with capture_layer_outputs(target, layer_ids or []) as feats, recurrent:
        out = target.model.get_decoder()(
            input_ids=input_ids[None],
            position_ids=positions[None],
            attention_mask=masks,
            past_key_values=cache,
            use_cache=True,
        )
    hidden = out.last_hidden_state[0]  # [n, hidden]
    features = torch.cat([f[0] for f in feats], dim=-1) if layer_ids else None  # [n, K * hidden]
    return hidden, features


_HEAD_T: "weakref.WeakKeyDictionary[nn.Module, tuple[int, int, torch.Tensor]]" = weakref.WeakKeyDictionary()


def head_weight_t(head: nn.Linear) -> torch.Tensor:
    """A contiguous [hidden, vocab] copy of the LM head's weight, made once per head (and again if the weight
    changes in place). It costs one more copy of the head in memory; only the CPU path below uses it."""
    w = head.weight
    hit = _HEAD_T.get(head)
    if hit is None or hit[0] != w.data_ptr() or hit[1] != w._version:
        hit = (w.data_ptr(), w._version, w.detach().T.contiguous())
        _HEAD_T[head] = hit
    return hit[2]


# The ways to compute a few rows of a bias-free head on a CPU. Which is fastest depends on the CPU, its BLAS, the
# thread count and the number of rows: for Gemma-3-270M's 262k-row head (ms for 1 / 2 / 4 / 8 rows)
#   Intel Xeon, one thread:  rows @ weight_t 46 / 59 / 68 / 96, (weight @ rows.T).T 48 / 130 / 125 / 122
#   AMD EPYC, one thread:    rows @ weight_t 25 / 49 / 98 / 111, (weight @ rows.T).T 43 / 26 / 31 / 67
# so :func:`head_rows` measures them once per (head shape, rows rounded up to a power of two, threads, dtype) and
# keeps the fastest: same products, summed in another order, and the same order for every head of one shape.
HEAD_KERNELS = {
    "rows @ weight_t": lambda head, h: h @ head_weight_t(head),  # [m, hidden] @ [hidden, out]
    "(weight @ rows.T).T": lambda head, h: (head.weight @ h.T).T.contiguous(),  # ([out, hidden] @ [hidden, m]).T
    "linear": lambda head, h: torch.nn.functional.linear(h, head.weight),
}
_HEAD_PLAN: dict[tuple[int, int, int, int, torch.dtype], str] = {}


def head_kernel(head: nn.Linear, rows: int, dtype: torch.dtype, repeats: int = 3) -> str:
    """The name of the fastest :data:`HEAD_KERNELS` entry for ``rows`` rows of ``head`` on this CPU: measured the
    first time (median of ``repeats`` after a warm-up, on random rows) and kept per (head shape, rows rounded up
    to a power of two, torch threads, dtype), so two heads of one shape (a drafter and its exported copy) give
    bit-identical rows."""
    bucket = 1 << (rows - 1).bit_length()
    key = (head.out_features, head.in_features, bucket, torch.get_num_threads(), dtype)
    if key not in _HEAD_PLAN:
        h = torch.randn(bucket, head.in_features, generator=torch.Generator().manual_seed(0)).to(dtype)  # [bucket, hidden]
        ms = {name: median_ms(lambda kernel=kernel: kernel(head, h), repeats, warmup=1)
              for name, kernel in HEAD_KERNELS.items()}
        _HEAD_PLAN[key] = min(ms, key=ms.get)
    return _HEAD_PLAN[key]


def head_rows(head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``head(hidden)`` for hidden [m, hidden] -> [m, out]; on a CPU a few rows without gradient of a bias-free head
    go through the kernel measured fastest for that many rows (:func:`head_kernel`)."""
    if (hidden.device.type == "cpu" and 0 < hidden.shape[0] <= 64 and isinstance(head, nn.Linear) and head.bias is None
            and not (torch.is_grad_enabled() and head.weight.requires_grad)):
        return HEAD_KERNELS[head_kernel(head, hidden.shape[0], hidden.dtype)](head, hidden)
    return head(hidden)


def lm_logits(target: Target, hidden: torch.Tensor) -> torch.Tensor:
    """Target logits (fp32) for final-normed hidden states [m, hidden] -> [m, vocab] (on a CPU through the fastest
    kernel for m rows: :func:`head_rows`)."""
    logits = head_rows(target.model.get_output_embeddings(), hidden).float()
    cap = getattr(target.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def compact_cache(cache: DynamicCache, past_len: int, keep: torch.Tensor) -> None:
    """Keep only the new entries ``keep`` (indices relative to ``past_len``, increasing) after ``past_len``.

    Used after verification: the accepted path's K/V move to the front of the appended window and the
    rest (rejected drafts, unvisited branches) is dropped. On a :class:`HybridCache` ``keep`` must be a
    root path of the last tree forward; the recurrent layers take the state of its last node.
    """
    m = keep.shape[0]
    idx = keep + past_len  # [m]
    if isinstance(cache, HybridCache):
        commit(cache, keep.tolist())
    for layer in cache.layers:
        if is_recurrent_layer(layer):
            continue
        for name in ("keys", "values"):
            t = getattr(layer, name)  # [batch, kv_heads, T, head_dim]
            sel = t.index_select(2, idx)
            t[:, :, past_len : past_len + m] = sel
            setattr(layer, name, t[:, :, : past_len + m])


@torch.no_grad()
def documentwise_forward(target: Target, ids: torch.Tensor, doc: torch.Tensor, pos: torch.Tensor, layer_ids: list[int]):
    """The target over packed rows with every document run on its own: a hybrid's recurrent layers
    have no mask, so documents sharing a row would leak into each other's state.

    ids, doc (document id per token, -1 = padding), pos: [b, T]. Each document's tokens are contiguous.
    Returns (features [b, T, len(layer_ids) * hidden], final-normed hidden [b, T, hidden]); padding rows are 0.
    """
    b, T = ids.shape
    features = torch.zeros(b, T, len(layer_ids) * target.hidden_size, dtype=target.dtype, device=ids.device)
    final = torch.zeros(b, T, target.hidden_size, dtype=target.dtype, device=ids.device)
    for r in range(b):
        for d in doc[r].unique().tolist():
            if d < 0:
                continue
            sel = (doc[r] == d).nonzero()[:, 0]  # [n] token indices of this document
            with capture_layer_outputs(target, layer_ids) as feats:
                out = target.model.get_decoder()(input_ids=ids[r, sel][None], position_ids=pos[r, sel][None], use_cache=False)
            features[r, sel] = torch.cat([f[0] for f in feats], dim=-1)
            final[r, sel] = out.last_hidden_state[0]
    return features, final


class PackedRows(Protocol):
    """Rows of one or more packed documents (``flashdraft.train.data.Batch`` is one)."""

    input_ids: torch.Tensor  # [b, T] long
    doc_ids: torch.Tensor  # [b, T] long, -1 = padding
    positions: torch.Tensor  # [b, T] long, position inside its own document


@torch.no_grad()
def target_pass(target: Target, batch: PackedRows, layer_ids: list[int], want_final: bool):
    """Frozen target over packed rows, documents isolated -> (features [b, T, K*H], final hidden [b, T, H] | None)."""
    ids, doc, pos = batch.input_ids, batch.doc_ids, batch.positions
    if recurrent_family(target.config) is not None:  # hybrid: no mask isolates documents in a recurrent state
        features, final = documentwise_forward(target, ids, doc, pos, layer_ids)
        return features, (final if want_final else None)
    T = ids.shape[1]
    idx = torch.arange(T, device=ids.device)
    vis = (idx[None, :, None] >= idx[None, None, :]) & (doc[:, :, None] == doc[:, None, :]) & (doc[:, None, :] >= 0)
    vis = vis | torch.eye(T, dtype=torch.bool, device=ids.device)  # padding rows see themselves: no empty rows
    masks = attention_masks(target.config, pos, pos, vis, target.dtype)  # per layer type, [b, 1, T, T]
    with capture_layer_outputs(target, layer_ids) as feats:
        out = target.model.get_decoder()(input_ids=ids, position_ids=pos, attention_mask=masks, use_cache=False)
    features = torch.cat(feats, dim=-1)  # [b, T, K * H]
    return features, (out.last_hidden_state if want_final else None)
