"""A reduced draft vocabulary: the d2t/t2d maps any drafter family can carry.

The maps live as buffers ``d2t`` [Vd] (draft id -> target id offset: target = draft + d2t[draft])
and ``t2d`` [V] (bool: the target id is in the draft vocabulary) directly on the drafter that owns
them, so checkpoints keep the tensor names vLLM and EAGLE-3 read. :class:`DraftVocab` registers
those buffers on its owner and does the arithmetic over them.
"""

from __future__ import annotations

import torch
from torch import nn

from flashdraft.models.drafter import DrafterError


def top_token_ids(primary: torch.Tensor, secondary: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` ids with the highest ``primary`` counts [V] (ties by ``secondary`` counts [V], then
    lower id) -> sorted ids [size]."""
    key = primary.long() * (int(secondary.sum()) + 1) + secondary.long()  # [V]
    return torch.argsort(-key, stable=True)[:size].sort().values


def reserved_token_ids(counts: dict[str, torch.Tensor], size: int, reserve: float = 0.0,
                       always: torch.Tensor | None = None, tie: torch.Tensor | None = None) -> torch.Tensor:
    """A draft vocabulary of ``size`` target ids from token counts per domain (``counts``: domain -> [V]):
    first the ``always`` ids [n]; then ``reserve`` (0..1) of ``size`` split evenly over the domains that
    have any count, each share filled with that domain's own most frequent ids not yet taken (domains in
    name order), so a minority domain is not crowded out; the rest by the summed count over all domains
    (ties by ``tie`` [V] counts, then lower id) -> sorted ids [size]."""
    if not counts:
        raise DrafterError("no token counts to draw a draft vocabulary from")
    total = sum(counts.values())  # [V]
    if not 0 < size <= total.numel():
        raise DrafterError(f"draft_vocab_size {size} must be in 1..{total.numel()} (the target's vocabulary)")
    if not 0.0 <= reserve <= 1.0:
        raise DrafterError(f"draft_vocab_reserve {reserve} must be a share in 0..1")
    tie = torch.zeros_like(total) if tie is None else tie
    taken = torch.zeros(total.numel(), dtype=torch.bool)  # [V]
    if always is not None and always.numel():
        taken[torch.as_tensor(always, dtype=torch.long)] = True
    if int(taken.sum()) > size:
        raise DrafterError(f"{int(taken.sum())} ids must be in a draft vocabulary of only {size}; raise draft_vocab_size")
    present = sorted(d for d, c in counts.items() if int(c.sum()) > 0)
    quota = int(reserve * size) // max(len(present), 1)
    for d in present:
        room = min(quota, size - int(taken.sum()))
        if room <= 0:
            break
        key = torch.where(taken, 0, counts[d].long())  # [V]
        order = torch.argsort(-key, stable=True)[:room]  # this domain's most frequent free ids, lower id first on ties
        taken[order[key[order] > 0]] = True
    rest = size - int(taken.sum())
    if rest > 0:
        key = torch.where(taken, -1, total.long())  # [V]
        taken[top_token_ids(key + 1, tie, rest)] = True  # +1: never-seen ids (0) still rank above taken ones (-1 -> 0)
    return taken.nonzero().flatten()


# Draft vocabulary sizes ``auto`` chooses among, and the share of a verify round's target compute the drafter's
# LM head may cost (see :func:`auto_draft_vocab_size` and "Draft vocabulary size" in docs/results.md).
AUTO_SIZES = (8192, 16384, 32768, 65536)
AUTO_HEAD_SHARE = 0.025


def head_share(target, size: int, block_size: int) -> float:
    """The drafter's LM head over ``size`` ids for the B-1 drafted slots of a round, as a share of the target's
    compute for the B tokens it verifies (multiply-adds of its decoder body and LM head)."""
    body = sum(p.numel() for n, p in target.model.get_decoder().named_parameters() if "embed" not in n)
    per_token = body + target.vocab_size * target.hidden_size
    return (block_size - 1) * size * target.hidden_size / (block_size * per_token)


def auto_draft_vocab_size(target, block_size: int) -> int | None:
    """``draft_vocab_size: auto``: None (the target's whole vocabulary, through its own LM head) when that head
    costs at most AUTO_HEAD_SHARE of a verify round (:func:`head_share`), else the largest of AUTO_SIZES that
    does (at least the smallest; None where the target's vocabulary is no larger than that)."""
    if head_share(target, target.vocab_size, block_size) <= AUTO_HEAD_SHARE:
        return None
    fits = [n for n in AUTO_SIZES if n < target.vocab_size and head_share(target, n, block_size) <= AUTO_HEAD_SHARE]
    if fits:
        return max(fits)
    return None if target.vocab_size <= AUTO_SIZES[0] else AUTO_SIZES[0]  # nothing smaller to draw


def vocab_coverage(t2d: torch.Tensor, sequences: list[list[int]], max_run: int) -> dict:
    """How much of ``sequences`` (target token ids, e.g. the target's own outputs) a draft vocabulary ``t2d``
    [V] (bool) can propose: ``share``, the fraction of tokens inside it, and ``runs[k - 1]``, the fraction of
    runs of k consecutive tokens (k = 1 .. max_run) that lie inside it whole: a cap on how often a drafted
    chain can be accepted k deep, whatever the drafter learns."""
    seqs = [torch.as_tensor(s, dtype=torch.long) for s in sequences if len(s)]
    lengths = torch.tensor([s.numel() for s in seqs], dtype=torch.long)  # [n]
    tokens = int(lengths.sum())
    if not tokens:
        return {"tokens": 0, "share": float("nan"), "runs": [float("nan")] * max_run}
    # every sequence followed by one outside slot, so no run of inside tokens crosses into the next sequence
    flat = torch.cat([torch.cat([t2d[s].long(), torch.zeros(1, dtype=torch.long)]) for s in seqs])  # [tokens + n]
    csum = torch.cat([torch.zeros(1, dtype=torch.long), flat.cumsum(0)])  # [tokens + n + 1]
    runs = []
    for k in range(1, max_run + 1):
        windows = int((lengths - k + 1).clamp_min(0).sum())
        whole = int(((csum[k:] - csum[:-k]) == k).sum())  # windows of k slots all inside (never a separator)
        runs.append(whole / windows if windows else float("nan"))
    return {"tokens": tokens, "share": int(flat.sum()) / tokens, "runs": runs}


def format_coverage(report: dict[str, dict[str, dict]], size: int) -> str:
    """Lines for a coverage report (part -> domain -> :func:`vocab_coverage`) of a ``size``-id draft vocabulary."""
    lines = [f"draft vocabulary ({size:,} ids): share of the target's tokens it can propose, and of runs of k "
             "consecutive tokens wholly inside it (a cap on a chain accepted k deep)"]
    for part, domains in report.items():
        for d, c in domains.items():
            if not c["tokens"]:
                continue
            ks = [k for k in (2, 4, 8, 15) if k <= len(c["runs"])]
            lines.append(f"  {part:>8} {d:<13} {c['share']:7.1%} of {c['tokens']:>9,} tokens; runs "
                         + " ".join(f"{k}: {c['runs'][k - 1]:.2f}" for k in ks))
    return "\n".join(lines)


class DraftVocab:
    """The draft vocabulary of ``owner``: buffers ``owner.d2t`` [size] and ``owner.t2d`` [vocab_size]."""

    def __init__(self, owner: nn.Module, vocab_size: int, size: int):
        if not 0 < size <= vocab_size:
            raise DrafterError(f"draft_vocab_size {size} must be in 1..vocab_size {vocab_size}")
        owner.register_buffer("d2t", torch.zeros(size, dtype=torch.long))
        owner.register_buffer("t2d", torch.zeros(vocab_size, dtype=torch.bool))
        self._owner, self.vocab_size, self.size = owner, vocab_size, size

    @property
    def d2t(self) -> torch.Tensor:
        return self._owner.d2t

    @property
    def t2d(self) -> torch.Tensor:
        return self._owner.t2d

    @torch.no_grad()
    def set(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Use the target ids ``token_ids`` [size] as the draft vocabulary -> the sorted ids [size]."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten().sort().values.to(self.d2t.device)
        if ids.numel() != self.size:
            raise DrafterError(f"{ids.numel()} draft ids for a drafter with draft_vocab_size {self.size}")
        if ids.unique().numel() != ids.numel() or not 0 <= int(ids[0]) <= int(ids[-1]) < self.vocab_size:
            raise DrafterError(f"draft ids must be distinct target ids in 0..{self.vocab_size - 1}")
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True
        return ids

    def token_ids(self) -> torch.Tensor:
        """Target ids of the draft vocabulary, in draft-id order -> [size] long."""
        return self.d2t + torch.arange(self.d2t.numel(), device=self.d2t.device)

    def index(self) -> torch.Tensor:
        """Target id -> draft id (-1 where the draft vocabulary lacks it) -> [vocab_size] long."""
        idx = torch.full((self.vocab_size,), -1, dtype=torch.long, device=self.d2t.device)
        ids = self.token_ids()
        idx[ids] = torch.arange(ids.numel(), device=ids.device)
        return idx

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids [...] -> target ids [...]."""
        return draft_ids + self.d2t[draft_ids]

    def to_target_logits(self, small: torch.Tensor) -> torch.Tensor:
        """Draft logits [m, size] -> target-vocabulary logits [m, vocab_size], -inf outside the draft vocabulary."""
        full = small.new_full((small.shape[0], self.vocab_size), float("-inf"))  # [m, V]
        full[:, self.token_ids()] = small
        return full


class DraftVocabHead:
    """Mixin for a drafter family with ``self.vocab`` (a :class:`DraftVocab` or None), its own ``lm_head``
    over the draft ids and a bound ``self.target``."""

    @torch.no_grad()
    def set_draft_vocab(self, token_ids: torch.Tensor) -> None:
        """Use the target ids ``token_ids`` [Vd] as the draft vocabulary: fill d2t/t2d and start the
        drafter's ``lm_head`` from the target's LM-head rows of those ids (same logits there)."""
        if self.vocab is None:
            n = torch.as_tensor(token_ids).numel()
            raise DrafterError(f"{n} draft ids for a drafter with draft_vocab_size None; build it with draft_vocab")
        ids = self.vocab.set(token_ids)
        w = self.target.model.get_output_embeddings().weight
        self.lm_head.weight.copy_(w.index_select(0, ids.to(w.device)).to(self.lm_head.weight))

    def draft_token_ids(self) -> torch.Tensor:
        """Target ids of the draft vocabulary, in draft-id order -> [Vd] long."""
        return self.vocab.token_ids()

    def t2d_index(self) -> torch.Tensor:
        """Target id -> draft id (-1 where the draft vocabulary lacks it) -> [vocab] long."""
        return self.vocab.index()
