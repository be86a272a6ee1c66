"""Cost-aware tree sizing: verify as many drafted nodes as pay for themselves on this machine.

A verify round of n tokens costs c(n) target seconds. On a GPU at batch 1, c is nearly flat up to
dozens of tokens, so a full budget costs nothing extra. On a CPU (or a GPU at high concurrency) c
grows with n: on Gemma-3-270M with 2 CPU cores, 8 tokens cost about twice one token. There a round
whose drafts are likely wrong loses time against a plain step.

With ``sizing="cost"`` a tree decoder measures c(n) once per target (:func:`verify_costs`, cached on
the target) and keeps, each round, the first m nodes of its best-first tree (the m most probable
prefixes; parents precede children, so any such prefix of the node list is a tree) for the m that
maximises expected tokens per second, (1 + sum of the m nodes' prefix probabilities) / c(m + 1)
(:func:`cost_sized`). m = 0 is a plain target step. The drafter's probabilities only choose the
tree's size; which tokens are emitted is still decided by the target alone, so decoding stays
lossless. The drafting cost is the same for every m and is left out of the ratio.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from flashdraft.decode.tree import DraftTree
from flashdraft.models.forward import cache_length, compact_cache, lm_logits, new_cache, target_forward

SIZINGS = ("fixed", "cost")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def verify_costs(target, max_tokens: int, context: int = 128, repeats: int = 3, spine: int = 8) -> list[float]:
    """Seconds of one verify round of n tokens, for n = 0 .. max_tokens (entry 0 unused, = entry 1).

    Measured on this target and device as the decoders run it: ``n`` tokens appended to a cache of
    ``context`` tokens (chain visibility), plus the LM head over min(n, ``spine``) rows (the walk's
    first batch). Sizes 1, 2, 4, ... and ``max_tokens`` are timed (median of ``repeats``), the rest
    interpolated linearly, then made non-decreasing (a busy machine can time a larger size faster).
    Cached on the target per (max_tokens, torch threads, context, spine).
    """
    key = (max_tokens, torch.get_num_threads(), context, spine)
    table = getattr(target, "_verify_costs", None)
    if table is None:
        table = target._verify_costs = {}
    if key in table:
        return table[key]
    dev = target.device
    sizes = sorted({*(2**i for i in range(int(math.log2(max_tokens)) + 1)), max_tokens})
    gen = torch.Generator().manual_seed(0)
    n_ids = context + len(sizes) * (repeats + 1) + max_tokens  # each timed run keeps one token in the cache
    ids = torch.randint(0, target.vocab_size, (n_ids,), generator=gen).to(dev)
    cache = new_cache(target)
    causal = torch.ones(context, context, dtype=torch.bool, device=dev).tril_()
    target_forward(target, cache, ids[:context], torch.arange(context, device=dev), causal, [])
    measured: dict[int, float] = {}
    at = context
    for n in sizes:
        times = []
        for r in range(repeats + 1):  # the first run of each size warms it up
            past = cache_length(cache)
            vis = torch.ones(n, n, dtype=torch.bool, device=dev).tril_()
            chain = list(range(-1, n - 1))
            _sync(dev)
            t0 = time.perf_counter()
            hidden, _ = target_forward(target, cache, ids[at : at + n], past + torch.arange(n, device=dev), vis, [],
                                       tree_parents=chain)
            lm_logits(target, hidden[: min(n, spine)])
            _sync(dev)
            if r:
                times.append(time.perf_counter() - t0)
            compact_cache(cache, past, torch.zeros(1, dtype=torch.long, device=dev))  # keep one node: a root path
            at += 1
        measured[n] = statistics.median(times)
    costs = [0.0] * (max_tokens + 1)
    for n in range(1, max_tokens + 1):
        lo = max(s for s in sizes if s <= n)
        hi = min(s for s in sizes if s >= n)
        f = 0.0 if hi == lo else (n - lo) / (hi - lo)
        costs[n] = (1 - f) * measured[lo] + f * measured[hi]
    for n in range(2, max_tokens + 1):  # more tokens never cost less: a noisy machine can time them so
        costs[n] = max(costs[n], costs[n - 1])
    costs[0] = costs[1]
    table[key] = costs
    return costs


def cost_sized(tree: DraftTree, costs: list[float], keep: int = 0) -> DraftTree:
    """The first m drafted nodes of a best-first ``tree`` (plus the root) for the m that maximises
    (1 + sum of their prefix probabilities) / costs[m + 1]; the first ``keep`` nodes stay in any case.

    ``tree.scores`` are log-probabilities of each node's prefix, non-increasing in node order after
    ``keep`` (what :func:`~flashdraft.decode.tree.best_first_tree` builds). costs: seconds per verify
    of n tokens, n = 0 .. at least len(tree).
    """
    n = len(tree) - 1
    if len(costs) < n + 2:
        raise ValueError(f"cost table covers {len(costs) - 1} tokens, the tree has {n + 1}")
    expected, best_m, best_rate = 1.0, keep, -1.0
    for m in range(0, n + 1):
        if m:
            expected += math.exp(tree.scores[m])
        if m >= keep:
            rate = expected / costs[m + 1]
            if rate > best_rate:
                best_m, best_rate = m, rate
    return truncated(tree, best_m)


def truncated(tree: DraftTree, m: int) -> DraftTree:
    """The root and the first ``m`` drafted nodes of ``tree`` (a tree, since parents precede children)."""
    if m >= len(tree) - 1:
        return tree
    k = m + 1
    return DraftTree(tokens=tree.tokens[:k], parents=tree.parents[:k], depths=tree.depths[:k], scores=tree.scores[:k])
