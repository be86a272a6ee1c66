"""The EAGLE-3 training objective (registered as ``eagle3``): the training-time test.

The drafter is unrolled ``ttt_steps`` steps over every position of the packed rows
(:mod:`flashdraft.models.eagle3.ttt`): step k's output at row ``i`` is inference's draft step k when
the round's context ends at ``i``, and predicts token ``i + k + 2``. To share the loop's metrics,
held-out diagnostics and n-gram baselines with DFlash, the steps are laid out as DFlash blocks: the
*anchor* ``t = i + 1`` is the bonus token of that round and slot ``k`` (1..steps) is step ``k - 1``,
predicting the token at ``t + k`` (slot 0 is never weighted).

Loss: soft cross-entropy against the target's probabilities at the position it predicts (the target
logits computed only for the draft-vocabulary rows of its LM head, from ``final_h``), softmax over
the draft vocabulary, slot weight ``ttt_decay ** (k - 1)``. A slot is dropped (weight 0) past the
end of its document or the row, outside the loss mask, or when the target's argmax (full vocabulary)
is outside the draft vocabulary (then it cannot be drafted; it still counts as a miss in ``acc``).
That rule needs the target's logits over the full vocabulary at every position (once per position,
not per slot); ``full_vocab_argmax: false`` drops only slots whose *data* token is outside the draft
vocabulary, which is the same rule when the data is the target's own greedy output, and runs the
target's LM head over the draft rows only (on Gemma-3-270M's 262k vocabulary, the full pass was 87% of
a CPU training step).
The normaliser is the micro-batch's static slot-weight sum, known before any forward (the loop sums
it over micro-batches and ranks); slots dropped for the argmax rule add 0 to the loss. The LM heads
and the loss run in row chunks under activation checkpointing.
"""

from __future__ import annotations

import math

import torch

from flashdraft.models.drafter import DrafterError, drafter_class
from flashdraft.models.forward import target_pass
from flashdraft.models.target import Target
from flashdraft.train.objective import (
    Batch, BlockMetrics, Blocks, LMHead, StepOutput, TrainError, block_targets, chunked_rows, init_norm_from_target,
)
from flashdraft.train.objectives import register_objective

DEFAULT_DRAFT_VOCAB = 32_000  # EAGLE-3's draft vocabulary (capped at the target's vocabulary)


def _soft_ce_chunk(lm_head, norm, h, t_logits):
    """Soft CE [m] of drafter outputs h [m, d] (pre-norm) against target logits [m, Vd]; the drafter's
    draft-id argmax [m] and the target's [m]."""
    logp = torch.log_softmax(lm_head(norm(h)).float(), dim=-1)  # [m, Vd]
    p = torch.softmax(t_logits.float(), dim=-1)  # [m, Vd]
    return -(p * logp).sum(-1), logp.argmax(-1), p.argmax(-1)


@register_objective("eagle3")
class Eagle3Objective(BlockMetrics):
    """Loss of an EAGLE-3 drafter on a batch, from the frozen target's features and final hidden states."""

    CONFIG_FIELDS = ("ttt_steps", "ttt_decay", "full_vocab_argmax", "lm_head_chunk", "checkpoint_lm_head")
    eval_method = "eagle3"  # the decoder the loop's real-decoding eval uses

    def __init__(self, drafter, *, ttt_steps: int = 7, ttt_decay: float = 0.8, full_vocab_argmax: bool = True,
                 lm_head_chunk: int = 128,
                 checkpoint_lm_head: bool = True, attention: str = "sdpa"):
        if not getattr(drafter, "stepwise", False) or not hasattr(drafter, "ttt_hidden"):
            raise TrainError(f"objective 'eagle3' trains EAGLE-3 drafters; {type(drafter).__name__} is not one "
                             "(drop init_from or pick the drafter's own objective)")
        if not 0 < ttt_decay <= 1:
            raise TrainError(f"ttt_decay {ttt_decay} must be in (0, 1]")
        self.drafter, self.steps, self.decay = drafter, ttt_steps, ttt_decay
        self.chunk, self.checkpoint_lm_head = lm_head_chunk, checkpoint_lm_head
        self.full_vocab_argmax = full_vocab_argmax
        self._head: tuple | None = None

    @property
    def block_size(self) -> int:
        return self.steps + 1

    @classmethod
    def wants_final(cls, cfg) -> bool:
        return True  # the teacher is the target's distribution at every position

    @classmethod
    def feature_layer_ids(cls, target: Target, cfg) -> list[int]:
        from flashdraft.models.eagle3 import eagle_layer_ids

        return list(cfg.target_layer_ids) if cfg.target_layer_ids is not None else eagle_layer_ids(target.num_layers)

    @classmethod
    def from_config(cls, drafter, cfg, attention: str = "sdpa") -> "Eagle3Objective":
        return cls(drafter, attention=attention, **{k: getattr(cfg, k) for k in cls.CONFIG_FIELDS})

    @classmethod
    def new_drafter(cls, target: Target, cfg, examples):
        """A fresh EAGLE-3 drafter: draft vocabulary from the data's token frequencies (``draft_vocab_size``,
        default min(32000, V)), ``lm_head`` from the target's rows of those ids, embedding = the target's
        (frozen, borrowed), max_depth = ttt_steps; final norm from the target's (``init_norm_from_target``)."""
        size = min(cfg.resolved_draft_vocab_size(target, cfg.ttt_steps + 1) or (
            target.vocab_size if cfg.draft_vocab_size == "auto" else DEFAULT_DRAFT_VOCAB), target.vocab_size)
        vocab = cfg.draft_vocab(examples, target, size)
        drafter = drafter_class("LlamaForCausalLMEagle3").for_target(
            target, target_layer_ids=cls.feature_layer_ids(target, cfg), draft_vocab=vocab, max_depth=cfg.ttt_steps,
            intermediate_size=cfg.intermediate_size, seed=cfg.seed,
        )
        if cfg.init_norm_from_target:  # lm_head starts from the target's rows: give its input the target's profile
            init_norm_from_target(drafter, target)
        return drafter

    def blocks(self, batch: Batch, every_anchor: bool = False, evaluate: bool = False) -> Blocks:
        """Every position t >= 1 whose predecessor is in its document anchors a block of ttt_steps slots
        (always every anchor: ``every_anchor`` and ``evaluate`` change nothing)."""
        b, T = batch.input_ids.shape
        dev = batch.input_ids.device
        anchors = torch.arange(1, max(T, 2), device=dev).clamp_max(T - 1).expand(b, -1).contiguous()  # [b, T - 1]
        doc = batch.doc_ids.gather(1, anchors)  # [b, A]
        valid = (batch.doc_ids.gather(1, (anchors - 1).clamp(min=0)) == doc) & (doc >= 0) & (anchors >= 1)
        gamma = math.inf if self.decay == 1 else -1.0 / math.log(self.decay)  # exp(-(k-1)/gamma) == decay ** (k-1)
        bl = block_targets(batch, anchors, valid, self.block_size, gamma)
        bl.weights = bl.weights * self.drafter.t2d[bl.labels].to(bl.weights.dtype)  # undraftable data tokens
        bl.norm = bl.weight_sum
        return bl

    def head(self, target: Target):
        if self._head is None or self._head[0] is not target:
            self._head = (target, LMHead(target))
        return self._head[1]

    def __call__(self, batch: Batch, blocks: Blocks, normaliser: float, features: torch.Tensor | None = None,
                 final_h: torch.Tensor | None = None, seed: int | None = None) -> StepOutput:
        """Loss of one micro-batch; ``features`` [b, T, K*H] and ``final_h`` [b, T, H] from a shared target
        pass or a feature cache (the target runs here without them)."""
        d = self.drafter
        try:
            target = d.target
        except DrafterError as e:
            raise TrainError(f"cannot train: {e}") from None
        if features is None:
            features, final_h = target_pass(target, batch, d.target_layer_ids, want_final=True)
        elif final_h is None:
            raise TrainError("objective 'eagle3' needs the target's final hidden states; build the feature cache "
                             "with --with-final")
        out = d.ttt_hidden(features, batch.input_ids, batch.doc_ids, batch.positions, self.steps)  # [S, b, T, d]
        b, T = batch.input_ids.shape
        A = blocks.anchors.shape[1]
        # slot k of anchor t = step k - 1 at row t - 1: [b, A, S, d], slot 0 (the anchor itself) zeros
        rows_of = (blocks.anchors - 1).clamp(min=0)[..., None, None].expand(-1, -1, self.steps, out.shape[-1])
        steps = out.permute(1, 2, 0, 3).gather(1, rows_of)
        h = torch.cat([steps.new_zeros(b, A, 1, steps.shape[-1]), steps], dim=2)  # [b, A, B, d]
        sel = blocks.weights > 0  # [b, A, B]
        rows = h[sel]  # [m, d]
        src = (blocks.anchors[..., None] + torch.arange(self.block_size, device=h.device) - 1).clamp(0, T - 1)  # [b, A, B]
        flat = (torch.arange(b, device=h.device)[:, None, None] * T + src)[sel]  # [m] row-major positions
        pos, inverse = flat.unique(return_inverse=True)  # a position feeds up to ttt_steps slots: its logits once
        teacher = final_h.reshape(b * T, -1).index_select(0, pos)  # [u, H]
        lm = self.head(target)
        ids = d.draft_token_ids()  # [Vd]
        keep_u, small_u = [], []
        with torch.no_grad():  # the target's draft-vocabulary logits (and, if asked, its full-vocabulary argmax)
            for s in range(0, teacher.shape[0], self.chunk):
                th = teacher[s : s + self.chunk].to(target.dtype)
                if self.full_vocab_argmax:
                    full = lm(th)  # [u, V] fp32
                    keep_u.append(d.t2d[full.argmax(-1)])
                    small_u.append(full.index_select(1, ids))  # [u, Vd]
                else:
                    small_u.append(lm(th, rows=ids))  # [u, Vd]
        small = torch.cat(small_u) if small_u else rows.new_zeros(0, ids.numel())
        keep = (torch.cat(keep_u) if keep_u else small.new_zeros(0, dtype=torch.bool))[inverse] if self.full_vocab_argmax \
            else torch.ones(rows.shape[0], dtype=torch.bool, device=rows.device)
        small = small[inverse]  # [m, Vd]
        outs = chunked_rows(_soft_ce_chunk, rows.shape[0], self.chunk, self.checkpoint_lm_head,
                            lambda c: (d.lm_head, d.norm, rows[c], small[c]))
        per_row, d_arg, t_arg = ([o[i] for o in outs] for i in range(3))
        correct = torch.zeros_like(sel)
        pred = torch.full_like(blocks.labels, -1)
        if per_row:
            kept = keep  # [m] bool
            per_row_t = torch.cat(per_row) * kept
            correct[sel] = (torch.cat(d_arg) == torch.cat(t_arg)) & kept
            pred[sel] = ids[torch.cat(d_arg)]  # draft ids -> target ids
        else:
            per_row_t = rows.new_zeros(0, dtype=torch.float32)
        weights = blocks.weights[sel]
        total = (per_row_t * weights).sum()
        if not torch.isfinite(total):
            raise TrainError(f"non-finite loss ({float(total.detach())}): check the drafter weights, the features of "
                             f"target {target.name} and the learning rate")
        return StepOutput(total / max(normaliser, 1e-12), float(total.detach()), float(weights.sum()), correct, blocks,
                          pred)
