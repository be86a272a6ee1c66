"""The DFlash training objective (registered as ``dflash``), shaped exactly like the inference step
(:meth:`DFlashDrafter.propose`); the forward over many blocks is :meth:`DFlashDrafter.train_hidden`.

Per sequence, random *anchors* t are drawn among supervised positions (loss_mask at t and t + 1,
same document; at most ``max_anchors``, sorted, seeded). Each anchor opens a block
[token_t, MASK x (B-1)] at positions t .. t+B-1. A block's queries see

* the fused target features of its own document at kv positions strictly before t (at inference
  the anchor is the bonus token, whose target feature does not exist yet), and
* its own block, bidirectionally (sliding-window layers: causal inside the block, plus the window,
  mirroring ``DFlashDrafter.block_mask``; see :mod:`flashdraft.models.dflash.masks`);

never another block or another packed document. Slot k (1..B-1) predicts the token at t + k
(same-position labels, as inference reads ``h[1:B]``); slot 0 is unweighted; label positions past the
end of the sequence, outside the loss mask or in another document get weight 0. Loss is CE on the
data tokens (default) or KL(target || drafter) on the target's logits at t + k - 1 (fp32), weighted
by exp(-(k-1)/gamma) and divided by a normaliser the caller computes over the whole optimiser step
(all micro-batches, all ranks). The LM head + loss run in row chunks under activation checkpointing,
so a 262k vocabulary never materialises for all rows at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from flashdraft.decode.lookup import lookup_hints
from flashdraft.errors import FlashdraftError
from flashdraft.models.drafter import DrafterError, drafter_class
from flashdraft.models.forward import lm_logits, target_pass
from flashdraft.models.target import Target
from flashdraft.train.objectives import pair, register_objective


# position weights computed from the drafter's own probabilities (normalised by the anchors with a supervised slot 1)
SELF_WEIGHTS = ("dpace", "first_error", "tree")


class TrainError(FlashdraftError, ValueError):
    """Training input or state that cannot be used; the message names the thing and the fix."""


@torch.no_grad()
def init_norm_from_target(drafter, target: Target) -> None:
    """Start the drafter's final norm with the per-channel profile of the target's final norm.

    The drafter's outputs feed the target's LM head, which reads channels with the weights of the
    target's own final norm (Gemma: x * (1 + w); on Gemma-3-270M mean ~26, up to ~300). From an init
    of 1, Adam would need thousands of steps to learn that profile. The copy is divided by its mean
    absolute value, so the initial logits stay soft (a full-scale copy gave CE ~150 at step 1).
    """
    norm = getattr(target.model.get_decoder(), "norm", None)
    if norm is None or getattr(norm, "weight", None) is None:
        return
    w = norm.weight.detach().float()
    if type(norm).__name__.startswith("Gemma"):  # Gemma RMSNorm multiplies by (1 + weight)
        w = 1.0 + w
    w = w / w.abs().mean().clamp(min=1e-6)
    drafter.norm.weight.copy_(w.to(drafter.norm.weight.dtype))


def default_gamma(block_size: int) -> float:
    """Position-decay gamma: 7 for B=16 and 4 for B=8 (paper); linear in B elsewhere, at least 1."""
    return {16: 7.0, 8: 4.0}.get(block_size, max(1.0, 4.0 + (block_size - 8) * 3.0 / 8.0))


@dataclass
class Batch:
    """A micro-batch of rows; a row holds one document, or several when packed."""

    input_ids: torch.Tensor  # [b, T] long (padding 0)
    loss_mask: torch.Tensor  # [b, T] bool
    doc_ids: torch.Tensor  # [b, T] long, -1 = padding
    positions: torch.Tensor  # [b, T] long, position inside its own document
    row_seeds: list[int]  # one anchor-sampling seed per row (from the example ids, not the step)

    @property
    def num_tokens(self) -> int:
        return int((self.doc_ids >= 0).sum())


@dataclass
class Blocks:
    """Anchors of a batch and the labels/weights of their block slots."""

    anchors: torch.Tensor  # [b, A] long (0 where not valid)
    valid: torch.Tensor  # [b, A] bool
    labels: torch.Tensor  # [b, A, B] long: token at anchor + k
    weights: torch.Tensor  # [b, A, B] float: decay weight, 0 where unsupervised (always 0 at k = 0)
    norm: float = 0.0  # this micro-batch's share of the step's loss normaliser (set by DFlashObjective.blocks)
    inputs: torch.Tensor | None = None  # [b, A, B] long: the blocks' input ids when draft slots hold hints (else MASK)
    supervised: torch.Tensor | None = None  # [b, A, B] bool: the target's own tokens, in the draft vocabulary or not

    @property
    def weight_sum(self) -> float:
        return float(self.weights.sum())


def anchor_candidates(loss_mask: torch.Tensor, doc_ids: torch.Tensor) -> torch.Tensor:
    """[T] bool: t can anchor a block iff t and t + 1 are supervised and in the same document."""
    ok = torch.zeros_like(loss_mask)
    ok[:-1] = loss_mask[:-1] & loss_mask[1:] & (doc_ids[:-1] == doc_ids[1:]) & (doc_ids[:-1] >= 0)
    return ok


def sample_anchors(batch: Batch, max_anchors: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded random anchors per row -> (anchors [b, A], valid [b, A]); A = the most any row got (>= 1)."""
    rows = []
    for r in range(batch.input_ids.shape[0]):
        cand = anchor_candidates(batch.loss_mask[r], batch.doc_ids[r]).nonzero().flatten()  # [n_cand]
        g = torch.Generator().manual_seed(int(batch.row_seeds[r]))
        pick = torch.randperm(cand.numel(), generator=g)[:max_anchors]
        rows.append(cand[pick].sort().values)
    a = max(1, max(x.numel() for x in rows))
    anchors = torch.zeros(len(rows), a, dtype=torch.long)
    valid = torch.zeros(len(rows), a, dtype=torch.bool)
    for r, x in enumerate(rows):
        anchors[r, : x.numel()], valid[r, : x.numel()] = x, True
    return anchors.to(batch.input_ids.device), valid.to(batch.input_ids.device)


def block_targets(batch: Batch, anchors: torch.Tensor, valid: torch.Tensor, block_size: int, gamma: float) -> Blocks:
    """Same-position labels (slot k <- token at anchor + k) and their decay weights."""
    T = batch.input_ids.shape[1]
    k = torch.arange(block_size, device=anchors.device)  # [B]
    pos = anchors[..., None] + k  # [b, A, B]
    inside = pos < T
    pos_c = pos.clamp(max=T - 1)
    flat = pos_c.flatten(1)  # [b, A * B]
    labels = batch.input_ids.gather(1, flat).view_as(pos)
    supervised = batch.loss_mask.gather(1, flat).view_as(pos)
    same_doc = batch.doc_ids.gather(1, flat).view_as(pos) == batch.doc_ids.gather(1, anchors)[..., None]
    decay = torch.exp(-(k - 1).clamp(min=0).float() / gamma)  # [B]
    ok = inside & supervised & same_doc & valid[..., None] & (k >= 1)
    w = ok.float() * decay
    return Blocks(anchors, valid, labels, w, float(w.sum()))


def hinted_inputs(batch: Batch, anchors: torch.Tensor, valid: torch.Tensor, block_size: int, mask_id: int,
                  prob: float) -> torch.Tensor:
    """[b, A, B] block input ids: the anchor's token, then in a seeded ``prob`` share of the valid blocks prompt
    lookup's chain from the anchor's own document up to the anchor (:func:`lookup_hints`, what a decoder with
    ``hints="lookup"`` fills in), MASK in the others."""
    ids, pos = batch.input_ids.cpu(), batch.positions.cpu()
    b, A = anchors.shape
    out = torch.full((b, A, block_size), mask_id, dtype=torch.long)
    out[..., 0] = ids.gather(1, anchors.cpu())
    for r in range(b):
        g = torch.Generator().manual_seed(int(batch.row_seeds[r]) ^ 0x5EED)  # its own stream, beside the anchors'
        use = (torch.rand(A, generator=g) < prob) & valid[r].cpu()
        for j in use.nonzero().flatten().tolist():
            t = int(anchors[r, j])
            out[r, j, 1:] = lookup_hints(ids[r, t - int(pos[r, t]) : t + 1], block_size - 1, mask_id)
    return out.to(anchors.device)


class LMHead:
    """The target's frozen LM head (+ Gemma-style final soft-capping), fp32 logits out.

    Under autocast the weight is cast once and cached per dtype on the target (shared by all
    variants): autocast would otherwise re-cast a frozen 262k x 640 matrix on every chunk. Without autocast it is exactly :func:`lm_logits`.
    """

    def __init__(self, target: Target):
        self.target = target
        if not hasattr(target, "_lm_head_cast"):  # one cast copy per target, shared by every variant's objective
            target._lm_head_cast = {}
        self._cast: dict[torch.dtype, torch.Tensor] = target._lm_head_cast

    def __call__(self, h: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [m, V] (or [m, len(rows)] over the vocabulary ids ``rows`` only)."""
        dev = h.device.type
        if not torch.is_autocast_enabled(dev) and rows is None:
            return lm_logits(self.target, h)
        dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
        if dt not in self._cast:
            self._cast[dt] = self.target.model.get_output_embeddings().weight.detach().to(dt)
        w = self._cast[dt] if rows is None else self._cast[dt].index_select(0, rows)  # [V or n_rows, d]
        logits = F.linear(h.to(dt), w).float()  # [m, V]
        cap = getattr(self.target.config, "final_logit_softcapping", None)
        return torch.tanh(logits / cap) * cap if cap else logits


class DraftHead:
    """A reduced draft vocabulary: the drafter's own (trained) ``lm_head`` over its draft ids; the
    teacher's logits (KL) are the target's, restricted to the same ids."""

    def __init__(self, drafter, target_head: LMHead):
        self.lm_head, self.target_head = drafter.lm_head, target_head
        self.ids = drafter.draft_token_ids()  # [Vd] target ids of the draft vocabulary

    def __call__(self, h: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        return self.lm_head(h).float()  # [m, Vd]

    def teacher(self, h: torch.Tensor) -> torch.Tensor:
        return self.target_head(h, self.ids)


def _chunk_loss(head, h, labels, teacher_h, kind: str, rows=None):
    """Per-row loss [m], the drafter's detached log-probability of the reference token [m], argmax
    hits [m] and the argmax itself [m] (head ids) for one chunk of rows (recomputed in backward under
    checkpointing)."""
    logits = head(h, rows)  # [m, V] fp32 (V = len(rows) for a sampled vocabulary, Vd for a draft vocabulary)
    if kind == "ce":
        per_row = F.cross_entropy(logits, labels, reduction="none")  # [m]
        ref, logq = labels, -per_row.detach()
    else:
        t_logits = head.teacher(teacher_h) if hasattr(head, "teacher") else head(teacher_h)
        t_logp = torch.log_softmax(t_logits.float(), dim=-1)  # [m, V]
        logp = torch.log_softmax(logits, dim=-1)
        per_row = (t_logp.exp() * (t_logp - logp)).sum(-1)  # KL(target || drafter)
        ref = t_logp.argmax(-1)
        logq = logp.detach().gather(1, ref[:, None])[:, 0]
    arg = logits.detach().argmax(-1)
    return per_row, logq, arg == ref, arg


def chunked_rows(fn: Callable[..., tuple], n_rows: int, chunk: int, checkpointed: bool,
                 args: Callable[[slice], tuple]) -> list[tuple]:
    """``fn(*args(rows))`` for each ``chunk`` rows of ``n_rows`` in order, under activation checkpointing when
    ``checkpointed`` and grad is on (the chunk's logits are then recomputed in backward instead of kept)
    -> the chunks' output tuples."""
    outs = []
    for s in range(0, n_rows, chunk):
        a = args(slice(s, s + chunk))
        outs.append(checkpoint(fn, *a, use_reentrant=False) if torch.is_grad_enabled() and checkpointed else fn(*a))
    return outs


def dpace_weights(q: torch.Tensor, supervised: torch.Tensor, alpha: float) -> torch.Tensor:
    """D-PACE position weights from the drafter's own (detached) probabilities of the labels.

    q, supervised: [b, A, B]. With smoothed q'_i = (1 - alpha) q_i + alpha (0 on unsupervised
    slots, which end the chain), slot k gets sum_{j >= k} prod_{i <= j} q'_i: the gradient of the
    expected accepted length sum_j prod_{i <= j} q_i with respect to log q_k. Slot 0 gets 0.
    """
    f = torch.where(supervised, (1 - alpha) * q + alpha, torch.zeros_like(q))[..., 1:]  # [b, A, B-1]
    prefix = torch.cumprod(f, dim=-1)
    suffix = prefix.flip(-1).cumsum(-1).flip(-1) * supervised[..., 1:]
    return torch.cat([torch.zeros_like(q[..., :1]), suffix], dim=-1).detach()  # [b, A, B]


def first_error_weights(q: torch.Tensor, supervised: torch.Tensor, alpha: float, focal: float) -> torch.Tensor:
    """Focal first-error position weights from the drafter's own (detached) label probabilities.

    q, supervised: [b, A, B]. With q'_i = (1 - alpha) q_i + alpha, slot k gets
    prod_{i < k} q'_i * (1 - q_k) ** focal: the probability that the drafted chain reaches slot k
    times how likely slot k is to break it there, so the loss goes to the position that ends the
    accepted prefix, not to slots behind an early miss or to slots already right. Slot 0 gets 0.
    """
    f = torch.where(supervised, (1 - alpha) * q + alpha, torch.zeros_like(q))[..., 1:]  # [b, A, B-1]
    reach = torch.cumprod(torch.cat([torch.ones_like(f[..., :1]), f[..., :-1]], dim=-1), dim=-1)  # prod_{i<k}
    w = reach * (1 - q[..., 1:]).clamp(min=0) ** focal * supervised[..., 1:]
    return torch.cat([torch.zeros_like(q[..., :1]), w], dim=-1).detach()  # [b, A, B]


def tree_weights(q: torch.Tensor, supervised: torch.Tensor, alpha: float, width: int) -> torch.Tensor:
    """Position weights from a surrogate of a draft tree's expected accepted length.

    A tree that keeps ``width`` candidates per depth accepts slot i with probability about
    p_i = 1 - (1 - q'_i) ** width (q'_i = (1 - alpha) q_i + alpha). Slot k gets the gradient of
    E[len] = sum_j prod_{i <= j} p_i with respect to log q'_k, as D-PACE does:
    (sum_{j >= k} prod_{i <= j} p_i) * width (1 - q'_k) ** (width - 1) q'_k / p_k.
    width = 1 is D-PACE. (The gradient with respect to log q_k carries one more factor
    (1 - alpha) q_k / q'_k, which vanishes with q_k: a fresh drafter, q ~ 1/vocab, then gets weights
    ~1e-4 and learns nothing; measured on Gemma-3-270M, training accuracy 0.005 at step 20 against
    0.11 for the other weightings.) Slot 0 gets 0.
    """
    qs = torch.where(supervised, (1 - alpha) * q + alpha, torch.zeros_like(q))[..., 1:]  # [b, A, B-1]
    p = 1 - (1 - qs).clamp(min=0) ** width
    prefix = torch.cumprod(p, dim=-1)
    tail = prefix.flip(-1).cumsum(-1).flip(-1)  # sum_{j >= k} prod_{i <= j} p_i
    dp = width * (1 - qs).clamp(min=0) ** (width - 1) * qs  # dp_k / dlog q'_k
    w = torch.where(p > 0, tail * dp / p.clamp(min=1e-12), torch.zeros_like(p)) * supervised[..., 1:]
    return torch.cat([torch.zeros_like(q[..., :1]), w], dim=-1).detach()  # [b, A, B]


@dataclass
class StepOutput:
    loss: torch.Tensor  # scalar: weighted loss sum / normaliser (backward-ready)
    weighted_loss_sum: float  # sum of weight * loss in this micro-batch
    weight_sum: float
    correct: torch.Tensor  # [b, A, B] bool: drafter argmax == label (False where weight 0)
    blocks: Blocks
    pred: torch.Tensor  # [b, A, B] long: the drafter's argmax as target ids (-1 where weight 0)


class BlockMetrics:
    """Metrics of objectives whose step output is laid out as blocks (``correct`` and ``weights``
    [b, A, B], slot 0 unweighted): loss, tokens, acc, tau proxy and per-slot accuracy."""

    eval_method = "dflash"  # the decoder the loop's real-decoding eval runs with this objective's drafters

    @classmethod
    def wants_final(cls, cfg) -> bool:
        """Whether a step needs the target's final hidden states (online pass or feature cache)."""
        return cfg.loss == "kl"

    @classmethod
    def feature_layer_ids(cls, target: Target, cfg) -> list[int]:
        """The target layers a fresh drafter of this objective reads (what a feature cache must hold)."""
        return list(cfg.target_layer_ids) if cfg.target_layer_ids is not None else target.default_layer_ids(cfg.num_layers)

    def metrics(self, out: "StepOutput", batch: Batch, blocks: Blocks) -> dict[str, torch.Tensor]:
        """Named sum/total pairs of one micro-batch (see :mod:`flashdraft.train.objectives`)."""
        a = acceptance_metrics(out.correct, blocks.weights)
        n = a["n_anchors"]
        sup = (blocks.weights > 0)[..., 1:]  # [b, A, B-1]
        slot_hits = (out.correct[..., 1:] & sup).flatten(0, -2).sum(0).tolist()
        slot_n = sup.flatten(0, -2).sum(0).tolist()
        return {
            "loss": pair(out.weighted_loss_sum, blocks.norm),
            "tokens": pair(batch.num_tokens, 1),
            "acc": pair(a["acc"] * n if n else 0.0, n),
            "tau_proxy": pair(a["tau_proxy"] * n if n else 0.0, n),
            "acc_per_slot": torch.tensor([slot_hits, slot_n], dtype=torch.float64),  # [2, B-1]
        }

    def summary(self, sums: dict[str, torch.Tensor], normaliser: float) -> dict:
        """The logged step metrics from the summed pairs (``normaliser``: the step's, all ranks)."""
        loss_sum, tokens = float(sums["loss"][0]), float(sums["tokens"][0])
        acc_n, n = sums["acc"].tolist()
        tau_n = float(sums["tau_proxy"][0])
        hits, sup = sums["acc_per_slot"]
        return {
            "acc_per_slot": [float(h / c) if c else math.nan for h, c in zip(hits.tolist(), sup.tolist())],
            "loss": loss_sum / max(normaliser, 1e-12),
            "acc": acc_n / max(n, 1), "tau_proxy": tau_n / max(n, 1), "tokens": int(tokens), "anchors": int(n),
        }


@register_objective("dflash")
class DFlashObjective(BlockMetrics):
    """Loss of a DFlash drafter on a batch, from the frozen target's features (computed here, or given).

    Position weights: ``decay`` (exp(-(k-1)/gamma), normalised by the step's summed weights) or
    ``dpace`` (:func:`dpace_weights`, normalised by the step's number of anchors with a supervised
    first slot). Either normaliser is fixed before the forward and summed over all micro-batches
    and ranks, so the update does not depend on how a step is split.
    """

    # the TrainConfig fields this objective reads (its config section)
    CONFIG_FIELDS = ("max_anchors", "gamma", "loss", "feature_noise", "lm_head_chunk", "checkpoint_layers",
                     "checkpoint_lm_head", "loss_vocab", "position_weights", "dpace_alpha", "focal", "tree_width",
                     "hint_prob", "loss_normaliser")

    def __init__(
        self,
        drafter,
        *,
        max_anchors: int = 64,
        gamma: float | None = None,
        loss: str = "ce",
        feature_noise: float = 0.0,
        lm_head_chunk: int = 128,
        checkpoint_layers: bool = False,
        checkpoint_lm_head: bool = True,
        loss_vocab: int | None = None,
        position_weights: str = "decay",
        dpace_alpha: float = 0.5,
        attention: str = "sdpa",
        focal: float = 1.0,
        tree_width: int = 4,
        hint_prob: float = 0.5,
        loss_normaliser: str | None = None,
    ):
        if loss not in ("ce", "kl"):
            raise TrainError(f"loss {loss!r} is not supported; use 'ce' (target tokens) or 'kl' (target logits)")
        if position_weights not in SELF_WEIGHTS + ("decay",):
            raise TrainError(
                f"position_weights {position_weights!r} is not supported; use 'decay', " + ", ".join(map(repr, SELF_WEIGHTS))
            )
        if loss_vocab is not None and loss != "ce":
            raise TrainError("loss_vocab (sampled softmax) applies to loss 'ce' only; drop it or use --loss ce")
        self.draft_vocab = drafter.cfg.draft_vocab_size is not None
        if self.draft_vocab and loss_vocab is not None:
            raise TrainError("loss_vocab (sampled softmax) and draft_vocab_size (reduced vocabulary) exclude each other; pick one")
        self.drafter, self.max_anchors, self.loss_kind = drafter, max_anchors, loss
        self.gamma = gamma if gamma is not None else default_gamma(drafter.block_size)
        self.position_weights, self.dpace_alpha = position_weights, dpace_alpha
        self.focal, self.tree_width = focal, tree_width
        self.noise, self.chunk, self.checkpoint_layers = feature_noise, lm_head_chunk, checkpoint_layers
        self.loss_vocab = loss_vocab  # None: full vocabulary; n: labels + n uniform negatives per micro-batch
        self.checkpoint_lm_head = checkpoint_lm_head  # False: keep each chunk's logits for backward (faster, more memory)
        self._head = None
        if attention not in ("sdpa", "flex"):
            raise TrainError(f"attention {attention!r} is not supported; use 'sdpa' or 'flex'")
        self.attention = attention
        self.hint_prob = hint_prob  # the share of training blocks with hints, for a drafter whose config says block_hints
        if loss_normaliser not in (None, "weights", "anchors", "slots"):
            raise TrainError(f"loss_normaliser {loss_normaliser!r} is not supported; use 'weights', 'anchors' or 'slots'")
        # what the step's weighted loss sum is divided by: None = the weighting's own (decay: the summed weights;
        # dpace / first_error / tree: the anchors with a supervised slot 1); "slots": the supervised slots, as
        # speculators' DFlash loss divides
        self.loss_normaliser = loss_normaliser or ("anchors" if position_weights in SELF_WEIGHTS else "weights")

    @classmethod
    def from_config(cls, drafter, cfg, attention: str = "sdpa") -> "DFlashObjective":
        """The objective over ``drafter`` from a :class:`~flashdraft.train.config.TrainConfig` (``attention``
        resolved: "sdpa" or "flex")."""
        return cls(drafter, attention=attention, **{k: getattr(cfg, k) for k in cls.CONFIG_FIELDS})

    drafter_architecture = "DFlashDraftModel"  # the family new_drafter builds

    @classmethod
    def family_fields(cls, cfg) -> dict:
        """Config fields of the drafter family beyond DFlash's (DFlash2's convolutions and selector); DFlash: none."""
        return {}

    @classmethod
    def new_drafter(cls, target: Target, cfg, examples):
        """A fresh drafter of :attr:`drafter_architecture` shaped by ``cfg`` (a reduced vocabulary from the data's
        token frequencies)."""
        vocab = None
        size = cfg.resolved_draft_vocab_size(target)
        if size:
            vocab = cfg.draft_vocab(examples, target, size)
        drafter = drafter_class(cls.drafter_architecture).for_target(
            target, num_layers=cfg.num_layers, block_size=cfg.block_size, target_layer_ids=cfg.target_layer_ids,
            mask_token_id=cfg.mask_token_id, intermediate_size=cfg.intermediate_size, seed=cfg.seed,
            draft_vocab=vocab, **cls.family_fields(cfg),
        )
        if cfg.init_norm_from_target:
            init_norm_from_target(drafter, target)
        return drafter

    def blocks(self, batch: Batch, every_anchor: bool = False, evaluate: bool = False) -> Blocks:
        """Anchors, labels and static weights of a micro-batch; ``norm`` is its share of the normaliser.
        ``every_anchor``: every position that can anchor a block, not ``max_anchors`` drawn ones; ``evaluate``:
        blocks as a decoder drafts them (with ``block_hints``, hints in every block, not a ``hint_prob`` share)."""
        anchors, valid = sample_anchors(batch, batch.input_ids.shape[1] if every_anchor else self.max_anchors)
        bl = block_targets(batch, anchors, valid, self.drafter.block_size, self.gamma)
        prob = (1.0 if evaluate else self.hint_prob) if getattr(self.drafter.cfg, "block_hints", None) else 0.0
        if prob > 0:
            bl.inputs = hinted_inputs(batch, anchors, valid, self.drafter.block_size, self.drafter.mask_token_id, prob)
        bl.supervised = bl.weights > 0  # what a drafter-free predictor (prompt lookup) is scored on
        if self.draft_vocab:  # a label outside the draft vocabulary can never be drafted: no loss there
            bl.weights = bl.weights * self.drafter.t2d[bl.labels].to(bl.weights.dtype)
        if self.position_weights in SELF_WEIGHTS:
            bl.weights = (bl.weights > 0).to(bl.weights.dtype)
        bl.norm = {"weights": bl.weight_sum, "anchors": float((bl.weights[..., 1] > 0).sum()),
                   "slots": float((bl.weights > 0).sum())}[self.loss_normaliser]
        return bl

    def extra_loss(self, h: torch.Tensor, sel: torch.Tensor, rows: torch.Tensor, labels: torch.Tensor, blocks: Blocks,
                   weights: torch.Tensor) -> torch.Tensor | float:
        """A family's loss term beside the unary one, weighted like it (DFlash2's selector): h [b, A, B, d], sel
        [b, A, B] the supervised slots, rows [m, d] = h[sel], labels [m] head columns, weights [m]. DFlash: 0."""
        return 0.0

    def head(self, target: Target):
        if self._head is None or self._head[0] is not target:
            lm = LMHead(target)
            self._head = (target, DraftHead(self.drafter, lm) if self.draft_vocab else lm)
        return self._head[1]

    def __call__(
        self,
        batch: Batch,
        blocks: Blocks,
        normaliser: float,
        features: torch.Tensor | None = None,
        final_h: torch.Tensor | None = None,
        seed: int | None = None,
    ) -> StepOutput:
        """Loss of one micro-batch. ``features`` [b, T, K*H] (this drafter's layers, in order) and
        ``final_h`` [b, T, H] come from a shared target pass or a feature cache; without them the
        target runs here. ``seed`` drives feature noise and sampled negatives (torch's global RNG
        without it)."""
        d = self.drafter
        try:
            target = d.target
        except DrafterError as e:
            raise TrainError(f"cannot train: {e}") from None
        head = self.head(target)
        if features is None:
            features, final_h = target_pass(target, batch, d.target_layer_ids, want_final=self.loss_kind == "kl")
        elif self.loss_kind == "kl" and final_h is None:
            raise TrainError("loss 'kl' needs the target's final hidden states; build the feature cache with --with-final")
        gen = None
        if seed is not None:
            gen = torch.Generator(device=features.device).manual_seed(int(seed))
        h = d.train_hidden(features, batch.input_ids, batch.doc_ids, batch.positions, blocks.anchors, self.noise,
                           self.checkpoint_layers, gen, self.attention, blocks.inputs)  # [b, A, B, d]
        sel = blocks.weights > 0  # [b, A, B]
        rows = h[sel]  # [m, d]
        labels = blocks.labels[sel]  # [m]
        teacher = None
        if self.loss_kind == "kl":  # the target's prediction of token anchor+k comes from position anchor+k-1
            src = (blocks.anchors[..., None] + torch.arange(d.block_size, device=h.device) - 1)
            src = src.clamp(0, final_h.shape[1] - 1)  # [b, A, B]; clamped rows have weight 0
            teacher = final_h.gather(1, src.flatten(1)[..., None].expand(-1, -1, final_h.shape[-1]))
            teacher = teacher.view(*src.shape, -1)[sel].to(h.dtype)  # [m, H]
        vocab_rows = None
        if self.loss_vocab:  # sampled softmax: the batch's labels plus uniform negatives
            neg = torch.randint(0, target.vocab_size, (self.loss_vocab,), device=labels.device, generator=gen)
            vocab_rows = torch.unique(torch.cat([labels, neg]))  # sorted
            labels = torch.searchsorted(vocab_rows, labels)  # ids inside the sampled vocabulary
        elif self.draft_vocab:
            labels = d.t2d_index()[labels]  # [m] draft ids (every selected label is in the draft vocabulary)
        outs = chunked_rows(_chunk_loss, rows.shape[0], self.chunk, self.checkpoint_lm_head, lambda c: (
            head, rows[c], labels[c], None if teacher is None else teacher[c], self.loss_kind, vocab_rows))
        per_row, logq, hits, args = ([o[i] for o in outs] for i in range(4))
        correct = torch.zeros_like(sel)
        pred = torch.full_like(blocks.labels, -1)
        if per_row:
            per_row_t = torch.cat(per_row)  # [m]
            correct[sel] = torch.cat(hits)
            arg = torch.cat(args)  # [m] head ids: sampled-vocabulary rows, draft ids or target ids
            pred[sel] = vocab_rows[arg] if vocab_rows is not None else (
                head.ids[arg] if self.draft_vocab else arg)
        else:
            per_row_t = h.new_zeros(0, dtype=torch.float32)
        if self.position_weights in SELF_WEIGHTS:
            q = torch.zeros_like(blocks.weights)
            if per_row:
                q[sel] = torch.cat(logq).exp().to(q.dtype)
            if self.position_weights == "dpace":
                weights = dpace_weights(q, sel, self.dpace_alpha)[sel]  # [m]
            elif self.position_weights == "first_error":
                weights = first_error_weights(q, sel, self.dpace_alpha, self.focal)[sel]
            else:
                weights = tree_weights(q, sel, self.dpace_alpha, self.tree_width)[sel]
        else:
            weights = blocks.weights[sel]
        total = (per_row_t * weights).sum()
        if per_row:
            total = total + self.extra_loss(h, sel, rows, labels, blocks, weights)
        if not torch.isfinite(total):
            raise TrainError(
                f"non-finite loss ({float(total.detach())}): check the drafter weights (NaN init?), the features of target "
                f"{target.name} and the learning rate"
            )
        ws = float(weights.sum())
        return StepOutput(total / max(normaliser, 1e-12), float(total.detach()), ws, correct, blocks, pred)


def acceptance_metrics(correct: torch.Tensor, weights: torch.Tensor) -> dict[str, float | list[float]]:
    """Training proxies: slot accuracy, per-slot accuracy and the expected accepted length tau.

    correct, weights: [b, A, B]. tau per anchor = 1 + sum_k prod_{i<=k} hit_i over supervised slots
    (an unsupervised slot ends the chain), averaged over anchors whose slot 1 is supervised.
    """
    sup = weights > 0
    hit = (correct & sup)[..., 1:].float()  # [b, A, B-1]
    chain = torch.cumprod(hit, dim=-1).sum(-1)  # [b, A]
    have = sup[..., 1]  # [b, A]
    n = int(have.sum())
    per_slot = [float(hit[..., j][sup[..., j + 1]].mean()) if sup[..., j + 1].any() else math.nan for j in range(hit.shape[-1])]
    return {
        "acc": float(hit[sup[..., 1:]].mean()) if sup.any() else math.nan,
        "tau_proxy": float(1 + chain[have].mean()) if n else math.nan,
        "acc_per_slot": per_slot,
        "n_anchors": n,
    }
