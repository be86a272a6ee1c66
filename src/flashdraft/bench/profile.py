"""``bench model --profile``: measure the cost-model inputs on this machine (see bench/verify_cost.py).

Times (median after warm-up, batch 1, on a warm KV cache of ``context`` tokens): the target body over
n tokens (tree mask), the LM head over m rows, one drafter pass, the host tree build + mask per
budget, and one KV compaction. Returns a :class:`MeasuredCosts`.
"""

from __future__ import annotations

import statistics
import time

import torch

from flashdraft.bench.costmodel import MeasuredCosts
from flashdraft.decode.tree import best_first_tree, chain_tree
from flashdraft.models.forward import compact_cache, lm_logits, new_cache, target_forward


def median_ms(fn, repeats: int, warmup: int) -> float:
    """Median wall time of ``fn()`` in ms over ``repeats`` runs after ``warmup`` untimed runs."""
    times = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


@torch.no_grad()
def profile_costs(target, drafter=None, sizes=(1, 2, 4, 8, 16, 32, 64, 129), head_rows=None,
                  budgets=(1, 4, 8, 16, 32, 64, 128), context: int = 128, repeats: int = 5, warmup: int = 1,
                  seed: int = 0) -> MeasuredCosts:
    """Measure the per-round costs of ``target`` (and ``drafter``) at batch 1 -> :class:`MeasuredCosts`."""
    g = torch.Generator().manual_seed(seed)
    dev, vocab = target.device, target.vocab_size
    cache = new_cache()
    ctx = torch.randint(0, vocab, (context,), generator=g, device=dev)
    _, feats = target_forward(target, cache, ctx, torch.arange(context, device=dev),
                              torch.ones(context, context, dtype=torch.bool, device=dev).tril(),
                              list(drafter.target_layer_ids) if drafter is not None else [])
    depth = drafter.block_size - 1 if drafter is not None else 15
    head_rows = head_rows or sorted({1, (depth + 1) // 2, depth + 1})  # the walk scores the spine: 1 .. depth + 1 rows

    def tree_of(n_nodes: int):
        lp = torch.log_softmax(torch.randn(depth, vocab, generator=g), -1)  # [L, V] random marginals
        return best_first_tree(int(ctx[-1]), lp, n_nodes) if n_nodes > 0 else chain_tree(int(ctx[-1]), [])

    body = {}
    for n in sizes:
        tr = tree_of(n - 1)
        ids = torch.tensor(tr.tokens, device=dev)
        pos = context + torch.tensor(tr.depths, device=dev)
        vis = tr.visibility(dev)

        def verify():
            target_forward(target, cache, ids, pos, vis)
            compact_cache(cache, context, torch.arange(0, device=dev))  # back to the warm context

        body[len(tr)] = median_ms(verify, repeats, warmup)

    hidden = torch.randn(max(head_rows), target.hidden_size, generator=g).to(dev, target.dtype)
    head = {m: median_ms(lambda m=m: lm_logits(target, hidden[:m]), repeats, warmup) for m in head_rows}

    build = {}
    for b in budgets:
        lp = torch.log_softmax(torch.randn(depth, vocab, generator=g), -1)
        build[b] = median_ms(lambda: best_first_tree(0, lp, b).visibility(dev), repeats, warmup)

    tr = tree_of(8)
    ids, pos = torch.tensor(tr.tokens, device=dev), context + torch.tensor(tr.depths, device=dev)
    vis = tr.visibility(dev)

    def commit():
        target_forward(target, cache, ids, pos, vis)
        t0 = time.perf_counter()
        compact_cache(cache, context, torch.arange(0, 4, device=dev))
        dt = time.perf_counter() - t0
        compact_cache(cache, context, torch.arange(0, device=dev))
        return dt

    commit_ms = statistics.median(commit() for _ in range(repeats)) * 1e3

    draft_ms, block = 0.0, 16
    if drafter is not None:
        block = drafter.block_size
        tokens = torch.cat([ctx, ctx[-1:]])

        def draft():
            drafter.reset()
            drafter.propose(tokens, feats)

        t_full = median_ms(draft, repeats, warmup)  # includes prefilling the drafter's context
        drafter.reset()
        drafter.propose(tokens, feats)
        cache_len = drafter.context_length()

        def draft_warm():
            drafter._ctx_cache = [(k[:, :, :cache_len], v[:, :, :cache_len]) for k, v in drafter._ctx_cache]
            drafter.propose(torch.cat([tokens, tokens[-1:]]), feats[-1:])

        try:
            draft_ms = median_ms(draft_warm, repeats, warmup)
        except Exception:  # noqa: BLE001  (fall back to the cold pass if the cache layout differs)
            draft_ms = t_full
        drafter.reset()
    return MeasuredCosts(body_ms=body, head_ms=head, draft_ms=draft_ms, draft_block=block,
                         tree_build_ms=build, commit_ms=commit_ms)
