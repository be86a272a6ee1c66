"""Draft trees: the shape every decoder verifies in one target forward.

A tree is a list of nodes; node 0 is the root (the bonus token of the previous round, already
committed but not yet in the target cache), every other node a drafted token with its parent.
Parents always precede children. A chain (DFlash) is the tree whose node i has parent i - 1; the
autoregressive step is the tree with the root only.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

import torch


@dataclass
class DraftTree:
    tokens: list[int]  # [n] node tokens, tokens[0] = root
    parents: list[int]  # [n] parent index, -1 for the root
    depths: list[int]  # [n] depth, 0 for the root
    scores: list[float] = field(default_factory=list)  # [n] drafter log-prob of the prefix (root 0)
    children: list[dict[int, int]] = field(default_factory=list)  # per node: token -> child index

    def __post_init__(self) -> None:
        if not self.children:
            self.children = [{} for _ in self.tokens]
            for i in range(1, len(self.tokens)):
                self.children[self.parents[i]].setdefault(self.tokens[i], i)

    def __len__(self) -> int:
        return len(self.tokens)

    def visibility(self, device=None) -> torch.Tensor:
        """Ancestor-or-self matrix [n, n] (bool): node i attends to node j iff j is on i's root path."""
        n = len(self.tokens)
        vis = torch.eye(n, dtype=torch.bool, device=device)
        for i in range(1, n):
            vis[i] |= vis[self.parents[i]]
        return vis

    def spine(self, start: int = 0, min_logprob: float = -math.inf) -> list[int]:
        """``start`` (the root by default) then, at each node, its first (best-scored) child: the path a walk most
        likely takes from there. With ``min_logprob`` (and ``scores``) it stops before the first child whose prefix
        log-probability, relative to ``start``'s, is below it: a node the walk is unlikely to reach."""
        path = [start]
        while self.children[path[-1]]:
            child = next(iter(self.children[path[-1]].values()))
            if self.scores and self.scores[child] - self.scores[start] < min_logprob:
                break
            path.append(child)
        return path

    def prefixes(self) -> set[tuple[int, ...]]:
        """Every node's token path from (excluding) the root, e.g. {(a,), (a, b), (c,)}."""
        paths: list[tuple[int, ...]] = [()]
        for i in range(1, len(self.tokens)):
            paths.append(paths[self.parents[i]] + (self.tokens[i],))
        return set(paths[1:])


def root_only(root: int) -> DraftTree:
    return DraftTree(tokens=[root], parents=[-1], depths=[0], scores=[0.0])


def chain_tree(root: int, drafts: list[int], logprobs: list[float] | None = None) -> DraftTree:
    """The chain root -> drafts[0] -> drafts[1] ...; ``logprobs``: the drafter's log-probability of each draft
    (its prefix scores are their running sums), else no scores."""
    n = len(drafts) + 1
    scores = [0.0, *itertools.accumulate(logprobs)] if logprobs is not None else []
    return DraftTree(tokens=[root, *drafts], parents=list(range(-1, n - 1)), depths=list(range(n)), scores=scores)


def argmax_chain(root: int, draft_logits: torch.Tensor, ids: torch.Tensor | None = None) -> DraftTree:
    """The chain of the drafter's top token at each position, draft_logits [L, C], scored by their log-probabilities.

    ``ids`` [C]: the target id of each column (a drafter's draft vocabulary); None when the C columns are the
    target vocabulary itself."""
    lp, cols = torch.log_softmax(draft_logits.float(), dim=-1).max(dim=-1)  # [L] each
    return chain_tree(root, (cols if ids is None else ids[cols]).tolist(), lp.tolist())


def tree_marginals(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """[..., L, C] a drafter's logits per depth -> the log-probabilities DDTree ranks prefixes by, at softmax
    ``temperature`` (1: the drafter's own marginals)."""
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def best_first_tree(root: int, log_probs: torch.Tensor, budget: int, ids: torch.Tensor | None = None) -> DraftTree:
    """DDTree's tree: the ``budget`` prefixes with the highest product of per-position marginals.

    log_probs: [L, C] drafter log-probabilities per depth (marginals, not conditionals); ``ids`` [C] the
    target id of each column as for :func:`argmax_chain`. Only the top min(budget, C) tokens per depth
    can appear (a prefix never outranks its parent), so after one top-k the heap explores rank tuples
    best-first (:func:`best_first_tree_by`). O(budget log budget).
    """
    if budget < 1:
        raise ValueError(f"tree budget must be >= 1, got {budget}")
    depth_max, vocab = log_probs.shape
    top_lp, top_cols = log_probs.float().topk(min(budget, vocab), dim=-1)  # [L, k]
    lp, ids = top_lp.tolist(), (top_cols if ids is None else ids[top_cols]).tolist()  # one device-to-host copy
    return best_first_tree_by(root, lambda d, parent_token: (lp[d], ids[d]), depth_max, budget)


def best_first_tree_by(root: int, children_of, depth_max: int, budget: int) -> DraftTree:
    """The ``budget`` prefixes with the highest summed log-probability, where ``children_of(d, token)`` gives the
    candidates at depth index d (0-based) after a node holding ``token``: (log-probabilities, best first; their
    target ids), each <= 0, so a prefix never outranks its parent. The heap explores best-first: each pop adds a
    prefix and pushes its next sibling (same parent, next rank) and its first child (next depth, rank 0);
    ``children_of`` is called once per node whose children are reached."""
    if budget < 1:
        raise ValueError(f"tree budget must be >= 1, got {budget}")
    tree = DraftTree(tokens=[root], parents=[-1], depths=[0], scores=[0.0], children=[{}])
    options = {0: children_of(0, root)}  # node -> (log-probs, ids) of its children
    # heap entry: (-score, parent node, depth index (0-based), rank)
    heap = [(-options[0][0][0], 0, 0, 0)] if options[0][0] else []
    while heap and len(tree.tokens) - 1 < budget:
        neg, parent, d, r = heapq.heappop(heap)
        if neg == float("inf"):
            break  # only -inf (impossible) prefixes remain
        lp, ids = options[parent]
        node = len(tree.tokens)
        tok = ids[r]
        tree.tokens.append(tok)
        tree.parents.append(parent)
        tree.depths.append(d + 1)
        tree.scores.append(-neg)
        tree.children.append({})
        tree.children[parent][tok] = node
        if r + 1 < len(lp):
            heapq.heappush(heap, (-(tree.scores[parent] + lp[r + 1]), parent, d, r + 1))
        if d + 1 < depth_max:
            options[node] = children_of(d + 1, tok)
            if options[node][0]:
                heapq.heappush(heap, (neg - options[node][0][0], node, d + 1, 0))
    return tree
