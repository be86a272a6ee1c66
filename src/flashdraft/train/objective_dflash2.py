"""The DFlash2 objective (registered as ``dflash2``): DFlash's unary loss, plus the candidate selector's.

The unary loss is :class:`~flashdraft.train.objective.DFlashObjective`'s, every slot weighting included. The
selector loss is teacher-forced: for each supervised slot, the ``selector_top_k`` best unary columns are the
candidates (the label put in place of the last one where the unary top-k misses it, so every slot has a label),
rescored given the true token before the slot (the anchor's token for slot 1), and cross-entropy over the K
scores is weighted by the slot's unary weight and added ``selector_loss_alpha`` times. The candidate set is
chosen without gradient; the scores carry it into both the selector and the unary head.

Its step output's predictions (``pred``, ``correct``: what the accuracy, tau proxy, held-out tables and walk tau
count) are the served chain's: each slot's best rescored candidate of the unary top-k after the true token before
it, which is what the chain drafts while it is still right. The metrics add the unary candidate recall at K (label
in the unary top-k), ``selector_acc`` (served pick right, over the slots whose label was a candidate, so at most
1) and ``unary_acc`` (the unary argmax's accuracy: before reranking).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from flashdraft.models.drafter import drafter_class
from flashdraft.train.objective import Blocks, DFlashObjective, TrainError, chunked_rows
from flashdraft.train.objectives import pair, register_objective


def selector_candidates(served: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """served [m, k] the unary top-k columns, labels [m] columns -> (training candidates [m, k], the label's place
    [m], label in the top-k [m])."""
    k = served.shape[1]
    cand = served.clone()
    hit = cand == labels[:, None]
    inside = hit.any(-1)
    cand[:, -1] = torch.where(inside, cand[:, -1], labels)
    place = torch.where(inside, hit.float().argmax(-1), torch.full_like(labels, k - 1))
    return cand, place, inside


def _selector_chunk(drafter, head, rows, labels, prev):
    """Selector CE [m], label in the top-k [m] bool, and the served pick [m] (head column: the best rescored
    candidate of the unary top-k, no label put in) for one chunk of rows."""
    unary = head(rows)  # [m, C] fp32
    served = unary.detach().topk(drafter.top_k, dim=-1).indices  # [m, K]
    cand, place, inside = selector_candidates(served, labels)
    scores = unary.gather(1, cand) + drafter.candidate_selector.transition(rows, prev, cand)  # [m, K]
    ce = F.cross_entropy(scores, place, reduction="none")
    with torch.no_grad():  # where the label was put in, the served last candidate needs its own score
        s = unary.gather(1, served) + drafter.candidate_selector.transition(rows, prev, served)
        pick = served.gather(1, s.argmax(-1, keepdim=True))[:, 0]
    return ce, inside, pick


@register_objective("dflash2")
class DFlash2Objective(DFlashObjective):
    """DFlash's objective plus the selector's (see the module docstring)."""

    CONFIG_FIELDS = DFlashObjective.CONFIG_FIELDS + ("selector_loss_alpha",)

    def __init__(self, drafter, *, selector_loss_alpha: float = 1.0, **kw):
        if kw.get("loss_vocab") is not None:
            raise TrainError("loss_vocab (sampled softmax) is not supported with objective dflash2: the selector needs "
                             "the unary top-k over the whole head; drop loss_vocab")
        if not hasattr(drafter, "candidate_selector"):
            raise TrainError(f"objective dflash2 trains a DFlash2 drafter, not a {type(drafter).__name__}; start "
                             "from a fresh one or a DFlash2 folder")
        super().__init__(drafter, **kw)
        self.selector_loss_alpha = selector_loss_alpha
        self._selector_stats = (0.0, 0.0, 0.0)  # label in top-k, served pick right, supervised slots (last call)
        self._picks = self._unary_correct = None
        self.last_unary_pred = None

    drafter_architecture = "DFlash2DraftModel"

    @classmethod
    def family_fields(cls, cfg) -> dict:
        return dict(conv_kernel_size=cfg.conv_kernel_size, conv_group_size=cfg.conv_group_size,
                    selector_rank=cfg.selector_rank, selector_top_k=cfg.selector_top_k)

    @classmethod
    def adopt(cls, drafter, cfg):
        """The drafter this objective trains from ``init_from``'s: a DFlash drafter becomes a DFlash2 one that drafts
        as it did (:meth:`DFlash2Drafter.from_dflash`, the convolution and selector fields from ``cfg``)."""
        if hasattr(drafter, "candidate_selector") or type(drafter).__name__ != "DFlashDrafter":
            return drafter
        print(f"init_from: DFlash drafter -> DFlash2 (convolutions at the identity, a fresh selector of rank "
              f"{cfg.selector_rank}, top-{cfg.selector_top_k})", file=sys.stderr)
        return drafter_class(cls.drafter_architecture).from_dflash(drafter, **cls.family_fields(cfg))

    def extra_loss(self, h, sel, rows, labels, blocks: Blocks, weights):
        prev = torch.cat([blocks.labels[..., :1], blocks.labels[..., :-1]], dim=-1)[sel]  # [m] the token before each slot
        head = self.head(self.drafter.target)
        outs = chunked_rows(_selector_chunk, rows.shape[0], self.chunk, self.checkpoint_lm_head,
                            lambda c: (self.drafter, head, rows[c], labels[c], prev[c]))
        ce = torch.cat([o[0] for o in outs])  # [m]
        inside, pick = torch.cat([o[1] for o in outs]), torch.cat([o[2] for o in outs])
        right = pick == labels
        self._selector_stats = (float(inside.sum()), float(right.sum()), float(inside.numel()))
        self._picks = pick if self.drafter.vocab is None else self.drafter.draft_token_ids()[pick]  # [m] target ids
        return self.selector_loss_alpha * (ce * weights).sum()

    def __call__(self, batch, blocks, normaliser, features=None, final_h=None, seed=None):
        """DFlash's step output with ``pred`` and ``correct`` the served chain's: each slot's pick after the true
        token before it (what the chain drafts while it is still right); the unary argmax's hits are kept for
        the ``unary_acc`` metric."""
        self._picks, self._unary_correct = None, None
        out = super().__call__(batch, blocks, normaliser, features, final_h, seed)
        self.last_unary_pred = out.pred  # [b, A, B] the unary argmax (before reranking), for held-out reports
        if self._picks is not None:
            sel = blocks.weights > 0
            self._unary_correct = out.correct
            out.pred = out.pred.clone()
            out.pred[sel] = self._picks
            out.correct = torch.zeros_like(out.correct)
            out.correct[sel] = self._picks == blocks.labels[sel]
        return out

    def metrics(self, out, batch, blocks):
        m = super().metrics(out, batch, blocks)
        inside, right, n = self._selector_stats
        m["candidate_recall"] = pair(inside, n)
        m["selector_acc"] = pair(right, inside)
        unary = self._unary_correct if self._unary_correct is not None else out.correct
        sup = (blocks.weights > 0)[..., 1:]
        m["unary_acc"] = pair(float((unary[..., 1:] & sup).sum()), float(sup.sum()))
        return m

    def summary(self, sums, normaliser):
        s = super().summary(sums, normaliser)
        for name in ("candidate_recall", "selector_acc", "unary_acc"):
            got, n = sums[name].tolist()
            s[name] = got / n if n else float("nan")
        return s
