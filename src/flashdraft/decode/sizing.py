"""Cost-aware tree sizing: verify as many drafted nodes as pay for themselves on this machine.

A verify round of n tokens costs c(n) target seconds. On a GPU at batch 1, c is nearly flat up to
dozens of tokens, so a full budget costs nothing extra. On a CPU (or a GPU at high concurrency) c
grows with n: on Gemma-3-270M with 2 CPU cores, 8 tokens cost about twice one token. There a round
whose drafts are likely wrong loses time against a plain step.

With ``sizing="cost"`` a tree decoder measures, once per target (:func:`verify_costs`, cached on the
target), what the decoder body costs for n tokens and what the LM head costs for r rows. Each round it
keeps the first m nodes of its best-first tree (the m most probable prefixes; parents precede children,
so any such prefix of the node list is a tree) for the m that maximises expected tokens per second,
(1 + sum of the m nodes' prefix probabilities) / (body(m + 1) + head(rows the walk scores)) (:func:`cost_sized`).
The rows are the walk's first LM-head batch, the spine of the cut tree (on a CPU cut where the drafter gives a
node little chance: ``SpeculativeDecoder.spine``), plus one row for each node off it the walk may reach,
weighted by its probability. m = 0 is a plain target step. The drafter's probabilities only choose the
tree's size; which tokens are emitted is still decided by the target alone, so decoding stays
lossless. The drafting cost is the same for every m and is left out of the ratio.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from flashdraft.decode.tree import DraftTree
from flashdraft.models.forward import cache_length, compact_cache, lm_logits, new_cache, target_forward

Sizing = Literal["fixed", "cost"]  # the config type of a sizing
SIZINGS: tuple[str, ...] = get_args(Sizing)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class VerifyCosts:
    """Seconds of a verify round's two parts on this target and device: ``body[n]`` for n tokens through the
    decoder body (n = 0 .. max_tokens, entry 0 = entry 1), ``head[r]`` for r LM-head rows (r = 0 .. max_rows,
    entry 0 = 0)."""

    body: list[float]
    head: list[float]

    def round(self, n: int, rows: float) -> float:
        """A round of n tokens whose walk scores ``rows`` head rows (fractional: an expected count)."""
        lo = min(int(rows), len(self.head) - 1)
        hi = min(lo + 1, len(self.head) - 1)
        return self.body[n] + self.head[lo] + (rows - int(rows)) * (self.head[hi] - self.head[lo])


def _seconds(fn, device: torch.device) -> float:
    """Wall seconds of one call of ``fn`` (the device synchronised before and after)."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def _interpolated(measured: dict[int, float], top: int) -> list[float]:
    """Sizes 0 .. top from the ``measured`` ones (linear in between), made non-decreasing: a busy machine can
    time a larger size faster."""
    sizes = sorted(measured)
    out = [0.0] * (top + 1)
    for n in range(1, top + 1):
        lo = max(s for s in sizes if s <= n)
        hi = min(s for s in sizes if s >= n)
        f = 0.0 if hi == lo else (n - lo) / (hi - lo)
        out[n] = (1 - f) * measured[lo] + f * measured[hi]
    for n in range(2, top + 1):
        out[n] = max(out[n], out[n - 1])
    return out


@torch.no_grad()
def verify_costs(target, max_tokens: int, context: int = 128, repeats: int = 3, max_rows: int = 8) -> VerifyCosts:
    """Measure :class:`VerifyCosts` for 1 .. ``max_tokens`` tokens appended to a cache of ``context`` tokens
    (chain visibility, as the decoders run it) and 1 .. ``max_rows`` LM-head rows. Sizes 1, 2, 4, ... and the
    largest are timed (median of ``repeats``, after one warm-up), the rest interpolated. Cached on the
    target per (max_tokens, torch threads, context, max_rows)."""
    key = (max_tokens, torch.get_num_threads(), context, max_rows)
    table = getattr(target, "_verify_costs", None)
    if table is None:
        table = target._verify_costs = {}
    if key in table:
        return table[key]
    dev = target.device
    gen = torch.Generator().manual_seed(0)

    def powers(top: int) -> list[int]:
        return sorted({*(2**i for i in range(int(math.log2(top)) + 1)), top})

    sizes = powers(max_tokens)
    n_ids = context + len(sizes) * (repeats + 1) + max_tokens  # each timed run keeps one token in the cache
    ids = torch.randint(0, target.vocab_size, (n_ids,), generator=gen).to(dev)
    cache = new_cache(target)
    causal = torch.ones(context, context, dtype=torch.bool, device=dev).tril_()
    target_forward(target, cache, ids[:context], torch.arange(context, device=dev), causal, [])
    body: dict[int, float] = {}
    at = context
    for n in sizes:
        times = []
        for _ in range(repeats + 1):  # the first run of each size warms it up
            past = cache_length(cache)
            vis = torch.ones(n, n, dtype=torch.bool, device=dev).tril_()
            pos = past + torch.arange(n, device=dev)
            times.append(_seconds(lambda: target_forward(target, cache, ids[at : at + n], pos, vis, [],
                                                         tree_parents=list(range(-1, n - 1))), dev))
            compact_cache(cache, past, torch.zeros(1, dtype=torch.long, device=dev))  # keep one node: a root path
            at += 1
        body[n] = statistics.median(times[1:])
    rows = torch.randn(max_rows, target.hidden_size, generator=gen).to(dev, target.dtype)
    head: dict[int, float] = {}
    for r in powers(max_rows):
        times = [_seconds(lambda: lm_logits(target, rows[:r]), dev) for _ in range(repeats + 1)]
        head[r] = statistics.median(times[1:])  # the first run warms it up
    costs = VerifyCosts(body=_interpolated(body, max_tokens), head=_interpolated(head, max_rows))
    costs.body[0] = costs.body[1]
    table[key] = costs
    return costs


def cost_sized(tree: DraftTree, costs: VerifyCosts, keep: int = 0, min_logprob: float = -math.inf) -> DraftTree:
    """The first m drafted nodes of a best-first ``tree`` (plus the root) for the m that maximises
    (1 + sum of their prefix probabilities) / costs.round(m + 1, rows(m)); the first ``keep`` nodes stay in any case.

    rows(m): the cut tree's spine (best children from the root, stopping before a node whose prefix
    log-probability is below ``min_logprob``: the walk's first LM-head batch) plus the probability of each
    off-spine node whose parent is on it (the walk may land there and score it in a batch of its own).
    ``tree.scores`` are log-probabilities of each node's prefix, non-increasing in node order after
    ``keep`` (what :func:`~flashdraft.decode.tree.best_first_tree` builds).
    """
    n = len(tree) - 1
    if len(costs.body) < n + 2:
        raise ValueError(f"cost table covers {len(costs.body) - 1} tokens, the tree has {n + 1}")
    on_spine = set(tree.spine(0, min_logprob))
    expected, rows, best_m, best_rate = 1.0, 1.0, keep, -1.0
    for m in range(0, n + 1):
        if m:
            p = math.exp(tree.scores[m])
            expected += p
            if m in on_spine:  # a spine node joins the first batch (its parent, an earlier node, is on it)
                rows += 1.0
            elif tree.parents[m] in on_spine:
                rows += p
        if m >= keep:
            rate = expected / costs.round(m + 1, rows)
            if rate > best_rate:
                best_m, best_rate = m, rate
    return truncated(tree, best_m)


def truncated(tree: DraftTree, m: int) -> DraftTree:
    """The root and the first ``m`` drafted nodes of ``tree`` (a tree, since parents precede children)."""
    if m >= len(tree) - 1:
        return tree
    k = m + 1
    return DraftTree(tokens=tree.tokens[:k], parents=tree.parents[:k], depths=tree.depths[:k], scores=tree.scores[:k])
