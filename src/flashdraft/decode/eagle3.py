"""EAGLE-3 decoding on the shared verifier: the chain (``eagle3``, the serving setting for batch > 1)
and EAGLE's dynamic tree (``eagle3_tree``: top-k per step, depth, total tokens).

Both need a drafter that drafts token by token (:func:`~flashdraft.models.drafter.is_stepwise`);
verification, losslessness (sample-and-walk) and statistics are :class:`SpeculativeDecoder`'s.
"""

from __future__ import annotations

import torch

from flashdraft.decode.base import DecodeError, register
from flashdraft.decode.speculative import SpeculativeDecoder
from flashdraft.decode.tree import DraftTree, argmax_chain
from flashdraft.models.drafter import is_stepwise, propose_scores
from flashdraft.models.target import Target


class StepwiseDecoder(SpeculativeDecoder):
    """A decoder whose rounds are drafted step by step; refuses block drafters by capability."""

    def __init__(self, target: Target, drafter=None, budget: int | None = None):
        super().__init__(target, drafter=drafter, budget=budget)
        if not is_stepwise(drafter):
            arch = getattr(drafter, "architecture", type(drafter).__name__)
            raise DecodeError(
                f"method {self.method!r} drafts token by token and needs a step-wise drafter (EAGLE-3); the {arch} "
                "drafter proposes a whole block per pass: use --method dflash (chain) or ddtree (tree) with it"
            )


@register("eagle3")
class Eagle3Decoder(StepwiseDecoder):
    """The greedy chain: ``budget`` drafted tokens per round (default: the drafter's max_depth), each
    from its own drafter step, verified in one forward."""

    def __init__(self, target: Target, drafter=None, budget: int | None = None):
        super().__init__(target, drafter=drafter, budget=budget)
        self.budget = budget if budget is not None else drafter.max_depth

    @property
    def max_depth(self) -> int:
        return self.budget

    def draft(self, tokens, feats):
        return propose_scores(self.drafter, tokens, feats, depth=self.budget)  # (logits [budget, C], ids [C])

    def draft_tree(self, root, proposal):
        logits, ids = proposal
        return argmax_chain(root, logits, ids)


@register("eagle3_tree")
class Eagle3TreeDecoder(StepwiseDecoder):
    """EAGLE's dynamic tree: ``budget`` = total drafted tokens (default 60), top-k ``top_k`` (10) per
    step, ``depth`` expansion steps after the first (default: the drafter's max_depth, 7), so the tree
    is at most depth + 1 deep; the EAGLE authors' defaults."""

    DEFAULT_BUDGET = 60
    DEFAULT_TOP_K = 10

    def __init__(self, target: Target, drafter=None, budget: int | None = None, top_k: int | None = None,
                 depth: int | None = None):
        super().__init__(target, drafter=drafter, budget=budget if budget is not None else self.DEFAULT_BUDGET)
        self.top_k = top_k if top_k is not None else self.DEFAULT_TOP_K
        self.depth = depth if depth is not None else drafter.max_depth
        if self.top_k < 1 or self.depth < 0:
            raise DecodeError(f"eagle3_tree needs top_k >= 1 and depth >= 0, got top_k {self.top_k}, depth {self.depth}")

    @property
    def max_depth(self) -> int:
        return self.depth + 1

    def draft(self, tokens: torch.Tensor, feats: torch.Tensor | None) -> DraftTree:
        t = self.drafter.propose_tree(tokens, feats, self.top_k, self.depth, self.budget)
        return DraftTree(tokens=list(t.tokens), parents=list(t.parents), depths=list(t.depths), scores=list(t.scores))

    def draft_tree(self, root, tree: DraftTree) -> DraftTree:
        return tree
