"""Prompt lookup (``ngram``): drafts copied from the context, no drafter, no training.

Each round the last n committed tokens (n from ``max_n`` down to ``min_n``) are searched for earlier
in the context (prompt + output so far); the tokens that followed the most recent earlier occurrence
are the draft, up to ``k`` of them. This is vLLM's ``ngram`` method and transformers'
``prompt_lookup_num_tokens``, except that the most recent match is taken (code repeats its latest
lines more often than its first ones). ``ngram_tree`` verifies several matches at once: the
continuations of distinct earlier occurrences (longest n first, most recent first) merged as branches
of one tree, under the same node ``budget`` as DDTree. ``ddtree_ngram`` is the hybrid: a DFlash
drafter's DDTree with the lookup's chain grafted on, all within one ``budget``.

Losslessness comes from the shared loop (:mod:`flashdraft.decode.speculative`): drafts only decide
how many target choices one forward yields, never which tokens are emitted.
"""

from __future__ import annotations

import torch

from flashdraft.decode.base import DecodeError, register
from flashdraft.decode.lookup import lookup
from flashdraft.decode.speculative import DDTreeDecoder, SpeculativeDecoder, draft_block
from flashdraft.decode.tree import DraftTree, best_first_tree, chain_tree


class PromptLookup:
    """The drafter protocol (``propose`` / ``reset`` / ``max_depth`` / ``target_layer_ids``) over the context.

    ``propose`` returns continuations (lists of token ids), best first, instead of logits.
    """

    target_layer_ids: list[int] = []  # reads no target features

    def __init__(self, k: int = 7, max_n: int = 3, min_n: int = 1, branches: int = 1):
        if not 1 <= min_n <= max_n:
            raise DecodeError(f"prompt lookup needs 1 <= lookup_min <= lookup_max, got lookup_min={min_n}, "
                              f"lookup_max={max_n}; raise lookup_max or lower lookup_min")
        if k < 1 or branches < 1:
            raise DecodeError(f"prompt lookup needs k >= 1 drafted tokens and branches >= 1, got k={k}, branches={branches}")
        self.k, self.max_n, self.min_n, self.branches = k, max_n, min_n, branches
        self.max_depth = k  # k drafts after the bonus

    def reset(self) -> None:
        pass

    def propose(self, tokens: torch.Tensor, new_features=None) -> list[list[int]]:
        """tokens: [L] committed ids (the bonus last) -> up to ``branches`` distinct continuations."""
        return lookup(tokens, self.k, self.max_n, self.min_n, self.branches)


def merge_branches(root: int, branches: list[list[int]], budget: int, tree: DraftTree | None = None) -> DraftTree:
    """A tree whose root paths are the given continuations (shared prefixes merged), at most ``budget``
    drafted nodes in all; with ``tree``, the branches are grafted onto it (in place).

    The first branch is inserted first, so in a new tree it is the spine (the walk's one-batch LM-head rows).
    """
    if tree is None:
        tree = DraftTree(tokens=[root], parents=[-1], depths=[0], scores=[0.0], children=[{}])
    for cont in branches:
        node = 0
        for tok in cont:
            child = tree.children[node].get(tok)
            if child is None:
                if len(tree.tokens) - 1 >= budget:
                    return tree
                child = len(tree.tokens)
                tree.tokens.append(tok)
                tree.parents.append(node)
                tree.depths.append(tree.depths[node] + 1)
                tree.scores.append(0.0)
                tree.children.append({})
                tree.children[node][tok] = child
            node = child
    return tree


LOOKUP_OPTIONS = ("lookup_min", "lookup_max")  # vLLM's prompt_lookup_min / prompt_lookup_max


@register("ngram")
class NgramDecoder(SpeculativeDecoder):
    """Prompt lookup as a chain: up to ``budget`` (default 7) drafts copied from the context per round.

    ``lookup_min`` / ``lookup_max``: the shortest and longest n-gram matched. A round with no match of at
    least ``lookup_min`` tokens drafts nothing (a plain target step). On a GPU at batch 1 a verified draft is
    almost free, so 1 drafts most; where a verify round costs more than a step (a CPU, large batches), a
    longer minimum drafts less often but more surely (``experiments/ngram_min_match.py`` measures it).
    """

    needs_drafter = False
    DEFAULT_K = 7
    OPTIONS = LOOKUP_OPTIONS

    def __init__(self, target, drafter=None, budget: int | None = None, lookup_min: int = 1, lookup_max: int = 3):
        # a DFlash drafter passed along is not used: the lookup reads the committed tokens only
        if budget is not None and budget < 1:
            raise DecodeError(f"--budget must be >= 1 (drafted tokens per round), got {budget}")
        self.lookup_min, self.lookup_max = lookup_min, lookup_max
        super().__init__(target, drafter=self.make_lookup(budget), budget=budget)

    def make_lookup(self, budget: int | None) -> PromptLookup:
        return PromptLookup(k=budget or self.DEFAULT_K, max_n=self.lookup_max, min_n=self.lookup_min)

    def draft_tree(self, root: int, proposals: list[list[int]]) -> DraftTree:
        return chain_tree(root, proposals[0] if proposals else [])


@register("ngram_tree")
class NgramTreeDecoder(NgramDecoder):
    """Prompt lookup as a tree: the continuations of several earlier matches, ``budget`` (default 32) nodes."""

    DEFAULT_BUDGET = 32

    def make_lookup(self, budget: int | None) -> PromptLookup:
        b = budget or self.DEFAULT_BUDGET
        return PromptLookup(k=self.DEFAULT_K, max_n=self.lookup_max, min_n=self.lookup_min, branches=b)

    def draft_tree(self, root: int, proposals: list[list[int]]) -> DraftTree:
        return merge_branches(root, proposals, self.budget or self.DEFAULT_BUDGET)


class _DrafterWithLookup:
    """A DFlash drafter whose ``propose`` also returns the prompt-lookup chain: ((logits [B-1, C], ids), chains).
    ``draft``: the drafter's own proposal (a DFlash decoder's ``draft``, block hints included)."""

    def __init__(self, drafter, lookup: PromptLookup, draft):
        self.drafter, self.lookup, self.draft = drafter, lookup, draft
        self.target_layer_ids, self.max_depth = drafter.target_layer_ids, drafter.max_depth

    def reset(self) -> None:
        self.drafter.reset()

    def propose(self, tokens: torch.Tensor, new_features):
        return self.draft(tokens, new_features), self.lookup.propose(tokens)


@register("ddtree_ngram")
class HybridTreeDecoder(DDTreeDecoder):
    """DDTree over the drafter's marginals plus the prompt-lookup chain (max_depth tokens), ``budget`` nodes in all.

    The lookup's nodes are reserved first; the drafter's best-first tree gets the rest of the budget
    and the lookup chain is grafted onto it (shared prefixes count once). ``lookup_min`` / ``lookup_max`` as
    for ``ngram``; ``sizing`` as for ``ddtree`` (it sizes the drafter's part; a lookup chain is always verified).
    """

    OPTIONS = LOOKUP_OPTIONS + DDTreeDecoder.OPTIONS

    def __init__(self, target, drafter=None, budget: int | None = None, lookup_min: int = 1, lookup_max: int = 3,
                 sizing: str = "fixed", tree_temperature: float | None = None, hints: str | None = None):
        super().__init__(target, drafter=drafter, budget=budget, sizing=sizing, tree_temperature=tree_temperature,
                         hints=hints)
        look = PromptLookup(k=drafter.max_depth, max_n=lookup_max, min_n=lookup_min)
        self.drafter = _DrafterWithLookup(drafter, look, lambda tokens, feats: draft_block(drafter, tokens, feats, self.hints))

    def draft(self, tokens, feats):
        return self.drafter.propose(tokens, feats)  # ((logits [B-1, C], ids), lookup chains)

    def draft_tree(self, root: int, proposal) -> DraftTree:
        (logits, ids), chains = proposal
        look = chains[0][: self.budget] if chains else []
        tree = self.sized(best_first_tree(root, self.marginals(logits), max(1, self.budget - len(look)), ids))
        return merge_branches(root, [look], self.budget, tree) if look else tree
