"""``bench model --profile``: measure the cost-model inputs on this machine (see experiments/verify_cost.py).

Times (median after warm-up, batch 1, on a warm KV cache of ``context`` tokens): the target body over
n tokens (tree mask), the LM head over m rows, one drafter pass, the host tree build + mask per
budget, and one KV compaction. Returns a :class:`MeasuredCosts`.

Hybrid targets are profiled through their exact tree path (each node's recurrent state from its
parent's), so ``body_ms`` already prices the recurrent layers per tree size; ``recurrent_ms`` is the
part of it spent inside the recurrent mixers (timed with module hooks) and ``recurrent_state_bytes``
what one tree node's states take.
"""

from __future__ import annotations

import statistics
import time

import torch

from flashdraft.bench.costmodel import MeasuredCosts
from flashdraft.decode.tree import best_first_tree, chain_tree
from flashdraft.models.drafter import propose_scores
from flashdraft.models.forward import compact_cache, lm_logits, new_cache, target_forward
from flashdraft.models.recurrent import recurrent_family, recurrent_layer_ids, recurrent_state_bytes
from flashdraft.timing import median_ms


class MixerTimer:
    """Wall time spent inside the recurrent mixers of a hybrid target (forward pre/post hooks)."""

    def __init__(self, target):
        fam = recurrent_family(target.config)
        self.mods = [fam.mixer(target.decoder_layers[i]) for i in recurrent_layer_ids(target.config)] if fam else []
        self.seconds, self._t0, self._handles = 0.0, 0.0, []

    def __enter__(self):
        def pre(*_):
            self._t0 = time.perf_counter()

        def post(*_):
            self.seconds += time.perf_counter() - self._t0

        for m in self.mods:
            self._handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []


def median_recurrent_ms(target, fn, repeats: int, warmup: int) -> float:
    """Median time in ms that ``fn()`` spends inside the target's recurrent mixers (:class:`MixerTimer`)."""
    times = []
    for i in range(warmup + repeats):
        with MixerTimer(target) as mt:
            fn()
        if i >= warmup:
            times.append(mt.seconds)
    return statistics.median(times) * 1e3


@torch.no_grad()
def profile_costs(target, drafter=None, sizes=(1, 2, 4, 8, 16, 32, 64, 129), head_rows=None,
                  budgets=(1, 4, 8, 16, 32, 64, 128), context: int = 128, repeats: int = 5, warmup: int = 1,
                  seed: int = 0) -> MeasuredCosts:
    """Measure the per-round costs of ``target`` (and ``drafter``) at batch 1 -> :class:`MeasuredCosts`."""
    g = torch.Generator().manual_seed(seed)
    dev, vocab = target.device, target.vocab_size
    cache = new_cache(target)
    hybrid = recurrent_family(target.config) is not None
    ctx = torch.randint(0, vocab, (context,), generator=g, device=dev)
    _, feats = target_forward(target, cache, ctx, torch.arange(context, device=dev),
                              torch.ones(context, context, dtype=torch.bool, device=dev).tril(),
                              list(drafter.target_layer_ids) if drafter is not None else [])
    depth = drafter.max_depth if drafter is not None else 15
    head_rows = head_rows or sorted({1, (depth + 1) // 2, depth + 1})  # the walk scores the spine: 1 .. depth + 1 rows

    def tree_of(n_nodes: int):
        logits = torch.randn(depth, vocab, generator=g)  # [L, V] random marginals
        if hybrid:  # a confident spine: trees reach the drafter's depth, the recurrent layers' sequential steps
            logits[torch.arange(depth), torch.randint(0, vocab, (depth,), generator=g)] += 9.0
        lp = torch.log_softmax(logits, -1)
        return best_first_tree(int(ctx[-1]), lp, n_nodes) if n_nodes > 0 else chain_tree(int(ctx[-1]), [])

    body, recurrent = {}, {}
    for n in sizes:
        tr = tree_of(n - 1)
        ids = torch.tensor(tr.tokens, device=dev)
        pos = context + torch.tensor(tr.depths, device=dev)
        vis = tr.visibility(dev)

        def verify(tr=tr, ids=ids, pos=pos, vis=vis):
            target_forward(target, cache, ids, pos, vis, tree_parents=tr.parents)
            compact_cache(cache, context, torch.arange(0, device=dev))  # back to the warm context

        body[len(tr)] = median_ms(verify, repeats, warmup)
        if hybrid:
            recurrent[len(tr)] = median_recurrent_ms(target, verify, repeats, warmup=1)

    hidden = torch.randn(max(head_rows), target.hidden_size, generator=g).to(dev, target.dtype)
    head = {m: median_ms(lambda m=m: lm_logits(target, hidden[:m]), repeats, warmup) for m in head_rows}

    tr = tree_of(8)
    ids, pos = torch.tensor(tr.tokens, device=dev), context + torch.tensor(tr.depths, device=dev)
    vis = tr.visibility(dev)

    spine = torch.tensor(tr.spine()[:4], device=dev)  # a root path: what a walk accepts

    def commit():
        target_forward(target, cache, ids, pos, vis, tree_parents=tr.parents)
        t0 = time.perf_counter()
        compact_cache(cache, context, spine)
        dt = time.perf_counter() - t0
        compact_cache(cache, context, torch.arange(0, device=dev))
        if hybrid:  # the accepted path's state was committed: restore the warm context's state
            restore()
        return dt

    snapshot = {i: (cache.layers[i].conv_states[0].clone(), cache.layers[i].recurrent_states[0].clone())
                for i in getattr(cache, "recurrent_ids", [])}

    def restore():
        for i, (c, r) in snapshot.items():
            cache.layers[i].conv_states[0], cache.layers[i].recurrent_states[0] = c.clone(), r.clone()

    commit_ms = statistics.median(commit() for _ in range(repeats)) * 1e3

    draft_ms, block, columns = 0.0, 16, vocab
    if drafter is not None:
        block = drafter.max_depth + 1
        tokens = torch.cat([ctx, ctx[-1:]])

        def draft():
            drafter.reset()
            return propose_scores(drafter, tokens, feats)

        t_full = median_ms(draft, repeats, warmup)  # includes prefilling the drafter's context
        columns = draft()[0].shape[-1]  # the draft vocabulary's width, which the tree's top-k runs over

        def draft_warm():
            drafter._ctx_cache = [(k[:, :, :cache_len], v[:, :, :cache_len]) for k, v in drafter._ctx_cache]
            propose_scores(drafter, torch.cat([tokens, tokens[-1:]]), feats[-1:])

        try:
            cache_len = drafter.context_length()  # a DFlash-style context K/V cache (other families: cold pass)
            draft_ms = median_ms(draft_warm, repeats, warmup)
        except Exception:  # noqa: BLE001  (fall back to the cold pass if the cache layout differs)
            draft_ms = t_full
        drafter.reset()

    build = {}
    for b in budgets:
        lp = torch.log_softmax(torch.randn(depth, columns, generator=g), -1)  # [L, C] as the decoders see it
        build[b] = median_ms(lambda: best_first_tree(0, lp, b).visibility(dev), repeats, warmup)
    return MeasuredCosts(body_ms=body, head_ms=head, draft_ms=draft_ms, draft_block=block,
                         tree_build_ms=build, commit_ms=commit_ms, recurrent_ms=recurrent,
                         recurrent_state_bytes=recurrent_state_bytes(target) if hybrid else 0)
