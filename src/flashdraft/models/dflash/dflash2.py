"""DFlash2: DFlash with local dynamic convolutions inside the block and a low-rank candidate selector.

DFlash drafts every slot of a block in one pass, each slot on its own. DFlash2 keeps the one pass and adds two
things that let a slot depend on its neighbours:

* **Local convolutions.** Around the attention and around the MLP of every draft layer, a causal convolution
  over the block's slots (``conv_kernel_size`` taps, never across a block boundary): slot j mixes slots j, j-1,
  ..., each tap a per-channel base kernel plus a token-dependent delta shared by ``conv_group_size`` channels
  and projected from the slot's own hidden state. The input side convolves the sublayer's input, the output
  side (its delta computed from the same input) the sublayer's output. Both start as the identity (tap 0 = 1,
  the rest and the projection 0), so a fresh DFlash2 layer computes what a DFlash layer does.
* **A candidate selector.** Per slot, the ``selector_top_k`` best unary candidates are rescored with
  ``unary + <P[predecessor] * W h_slot, S[candidate]>`` (P, S: ``selector_rank``-wide codebooks over the
  target vocabulary and the head's columns, W: a projection of the slot's hidden state). The predecessor is
  the token drafted in the slot before (the bonus token for slot 1), so a chain is chosen left to right.

Files: DFlash's, plus ``layers.N.{attention_conv,mlp_conv}.{base_kernel [2, k, d], kernel_projection.weight
[2 k G, d]}`` and ``candidate_selector.{predecessor_codebook [vocab, r], successor_codebook [C, r],
hidden_projection.weight [r, d]}`` (C = the draft vocabulary, or the target's); ``config.json`` adds
``conv_kernel_size``, ``conv_group_size``, ``selector_rank``, ``selector_top_k``. With the whole vocabulary
these are the tensor and field names speculators' ``DFlash2DraftModel`` reads.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from flashdraft.models.dflash.config import DFlashConfig
from flashdraft.models.dflash.layers import DFlashLayer
from flashdraft.models.dflash.model import DFlashDrafter
from flashdraft.models.drafter import DrafterError, register_drafter


class DFlash2Config(DFlashConfig):
    """``config.json`` of a DFlash2 drafter: DFlash's fields plus the convolutions' and the selector's."""

    family_name: ClassVar[str] = "DFlash2"

    architectures: list[str] = ["DFlash2DraftModel"]
    conv_kernel_size: int = Field(2, ge=1, description="causal taps of each local convolution")
    conv_group_size: int = Field(16, ge=1, description="channels that share one token-dependent kernel delta")
    selector_rank: int = Field(256, ge=1, description="width of the candidate selector's codebooks")
    selector_top_k: int = Field(16, ge=1, description="unary candidates the selector rescores per slot")

    @model_validator(mode="after")
    def _check_dflash2(self) -> "DFlash2Config":
        if self.hidden_size % self.conv_group_size:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of conv_group_size "
                             f"{self.conv_group_size}; pick a group size that divides it")
        if self.conv_kernel_size > self.block_size:
            raise ValueError(f"conv_kernel_size {self.conv_kernel_size} is longer than the block ({self.block_size})")
        columns = self.draft_vocab_size or self.vocab_size
        if self.selector_top_k > columns:
            raise ValueError(f"selector_top_k {self.selector_top_k} exceeds the {columns} ids the head drafts")
        return self


def block_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int) -> torch.Tensor:
    """Causal convolution over the slots of consecutive blocks, never across a block boundary.

    x: [b, n, d] with n a multiple of ``block_size`` (slot = index mod block_size); delta: [b, n, k, G]
    token-dependent kernel deltas (one per group of d / G channels); base: [k, d] per-channel kernels.
    out[j] = sum_tap x[j - tap] * (base[tap] + delta[j, tap]) over the taps with tap <= slot(j)."""
    b, n, d = x.shape
    k, G = delta.shape[-2], delta.shape[-1]
    xg = x.view(b, n, G, d // G)  # [b, n, G, g]
    slot = torch.arange(n, device=x.device) % block_size  # [n]
    out = torch.zeros_like(xg)
    for tap in range(k):
        shifted = xg if tap == 0 else F.pad(xg, (0, 0, 0, 0, tap, 0))[:, :n]  # x[j - tap], zeros before the start
        coef = base[tap].view(G, -1).to(x.dtype) + delta[:, :, tap, :, None]  # [b, n, G, g]
        out = out + shifted * coef * (slot >= tap).view(1, n, 1, 1).to(x.dtype)
    return out.view(b, n, d)


class BlockConv(nn.Module):
    """The input- and output-side convolutions around one sublayer, both driven by its input."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.groups = kernel_size, hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))  # [in/out, k, d]
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The identity: tap 0 is 1, every other tap and the token-dependent part 0."""
        self.base_kernel.zero_()
        self.base_kernel[:, 0] = 1.0
        self.kernel_projection.weight.zero_()

    def prepare(self, x: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x [b, n, d] (blocks of ``block_size`` slots) -> (x convolved, the output side's deltas [b, n, k, G])."""
        deltas = self.kernel_projection(x).view(*x.shape[:-1], 2, self.kernel_size, self.groups)  # [b, n, 2, k, G]
        return block_conv(x, deltas[:, :, 0], self.base_kernel[0], block_size), deltas[:, :, 1]

    def finish(self, y: torch.Tensor, deltas: torch.Tensor, block_size: int) -> torch.Tensor:
        """The sublayer's output y [b, n, d] convolved with the deltas :meth:`prepare` returned."""
        return block_conv(y, deltas, self.base_kernel[1], block_size)


class DFlash2Layer(DFlashLayer):
    """A DFlash layer with a :class:`BlockConv` around its attention and around its MLP."""

    def __init__(self, cfg: DFlash2Config, layer_type: str):
        super().__init__(cfg, layer_type)
        self.cfg = cfg  # the drafter's own config: a block size set after loading reaches the convolutions
        args = (cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)
        self.attention_conv = BlockConv(*args)
        self.mlp_conv = BlockConv(*args)

    def forward(self, x, rope_x, ctx_kv, mask):
        B = self.cfg.block_size
        h, out_deltas = self.attention_conv.prepare(self.input_layernorm(x), B)
        x = x + self.attention_conv.finish(self.self_attn(h, rope_x, ctx_kv, mask), out_deltas, B)
        h, out_deltas = self.mlp_conv.prepare(self.post_attention_layernorm(x), B)
        return x + self.mlp_conv.finish(self.mlp(h), out_deltas, B)


class CandidateSelector(nn.Module):
    """Rescores a slot's unary candidates given the token before it: unary + <P[prev] * W h, S[candidate]>."""

    def __init__(self, vocab_size: int, columns: int, hidden_size: int, rank: int):
        super().__init__()
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))  # [vocab, r]: any token can precede
        self.successor_codebook = nn.Parameter(torch.empty(columns, rank))  # [C, r]: the head's columns
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        nn.init.normal_(self.predecessor_codebook, std=std)
        nn.init.normal_(self.successor_codebook, std=std)
        nn.init.normal_(self.hidden_projection.weight, std=std)

    def transition(self, h: torch.Tensor, prev: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """h [..., d] slot states, prev [...] predecessor target ids, cand [..., K] column ids -> [..., K] fp32."""
        ctx = self.predecessor_codebook[prev] * self.hidden_projection(h).to(self.predecessor_codebook.dtype)  # [..., r]
        return (ctx[..., None, :] * self.successor_codebook[cand]).sum(-1).float()  # [..., K]


@register_drafter("DFlash2DraftModel")
class DFlash2Drafter(DFlashDrafter):
    """DFlash2 drafter: DFlash's pass with :class:`DFlash2Layer` layers, then the :class:`CandidateSelector`.

    :meth:`propose_scores` gives the chain a decoder drafts: per slot the top-k unary candidates rescored given the
    token chosen for the slot before (greedy, left to right), every other column at -inf, so a chain decoder's
    argmax is the selector's pick. :meth:`propose_candidates` gives a tree builder the same pieces to score any
    predecessor."""

    config_class = DFlash2Config
    layer_class = DFlash2Layer
    folder_kind = "a DFlash2 drafter folder"

    def __init__(self, cfg: DFlash2Config):
        super().__init__(cfg)
        columns = cfg.draft_vocab_size or cfg.vocab_size
        self.candidate_selector = CandidateSelector(cfg.vocab_size, columns, cfg.hidden_size, cfg.selector_rank)

    @classmethod
    def from_dflash(cls, dflash: DFlashDrafter, **fields) -> "DFlash2Drafter":
        """A DFlash2 drafter that drafts as the DFlash drafter ``dflash`` does before training: its every weight
        (draft vocabulary and feature scale included), the convolutions at the identity and a selector that adds 0
        (successor codebook 0, the rest fresh; ``fields``: conv_kernel_size, conv_group_size, selector_rank,
        selector_top_k). Bound as ``dflash`` is."""
        keep = dflash.cfg.model_dump(exclude={"architectures", "auto_map"})
        cfg = cls.config_class(**keep, **fields)
        ref = dflash.fc.weight
        with torch.random.fork_rng():
            torch.manual_seed(0)
            new = cls(cfg).to(device=ref.device, dtype=ref.dtype)
        missing, unexpected = new.load_state_dict(dflash.state_dict(), strict=False)
        if unexpected or any(not ("_conv." in k or k.startswith("candidate_selector.")) for k in missing):
            raise DrafterError(f"DFlash weights did not map onto DFlash2: missing {missing[:6]}, unexpected {unexpected[:6]}")
        new.set_feature_scale(dflash.feature_scale, keep_function=False)  # fc.weight was copied in its scaled form
        with torch.no_grad():  # the selector adds exactly 0 until training moves S (its gradient is P[prev] * W h)
            new.candidate_selector.successor_codebook.zero_()
        return new.bind(dflash.target) if dflash._target is not None else new

    def reset_parameters(self, std: float = 0.02) -> None:
        super().reset_parameters(std)
        for m in self.modules():
            if isinstance(m, (BlockConv, CandidateSelector)):
                m.reset_parameters()

    @property
    def top_k(self) -> int:
        return self.cfg.selector_top_k

    @torch.no_grad()
    def propose_candidates(self, tokens: torch.Tensor, new_features: torch.Tensor | None,
                           hints: torch.Tensor | None = None) -> "Candidates":
        h = self.propose_hidden(tokens, new_features, hints)  # [B - 1, d]
        unary, ids = self.scores(h)  # [B - 1, C], [C] or None
        top, cols = unary.topk(self.top_k, dim=-1)  # [B - 1, K]
        return Candidates(self, h, top, cols, ids, int(tokens[-1]))

    @torch.no_grad()
    def propose_scores(self, tokens: torch.Tensor, new_features: torch.Tensor | None,
                       hints: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        cand = self.propose_candidates(tokens, new_features, hints)
        C = cand.ids.numel() if cand.ids is not None else self.cfg.vocab_size
        out = torch.full((cand.top.shape[0], C), float("-inf"))  # [B - 1, C]
        prev = cand.bonus
        for k in range(cand.top.shape[0]):
            scores = cand.scores(k, prev)  # [K]
            out[k, cand.cols[k]] = scores
            prev = cand.token(k, int(scores.argmax()))
        return out, cand.ids

    @torch.no_grad()
    def propose(self, tokens: torch.Tensor, new_features: torch.Tensor | None,
                hints: torch.Tensor | None = None) -> torch.Tensor:
        scores, ids = self.propose_scores(tokens, new_features, hints)
        return scores if ids is None else self.vocab.to_target_logits(scores)


class Candidates:
    """One DFlash2 pass: per slot k the top-k unary candidates ``cols`` [B - 1, K] (head columns, target ids
    ``ids[cols]`` with a draft vocabulary) with unary logits ``top`` [B - 1, K], and the slot states to rescore
    them given any predecessor."""

    def __init__(self, drafter: DFlash2Drafter, h: torch.Tensor, top: torch.Tensor, cols: torch.Tensor,
                 ids: torch.Tensor | None, bonus: int):
        self.drafter, self.h, self.top, self.cols, self.ids, self.bonus = drafter, h, top, cols, ids, bonus

    def token(self, k: int, j: int) -> int:
        """Target id of slot k's candidate j."""
        col = int(self.cols[k, j])
        return col if self.ids is None else int(self.ids[col])

    def scores(self, k: int, prev: int) -> torch.Tensor:
        """Slot k's candidates rescored after target id ``prev`` -> [K] fp32 (unary + transition)."""
        sel = self.drafter.candidate_selector
        prev_t = torch.tensor(prev, device=self.h.device)
        return self.top[k] + sel.transition(self.h[k], prev_t, self.cols[k])

    def children(self, temperature: float = 1.0):
        """The tree builder's ``children_of(k, token)`` (:func:`flashdraft.decode.tree.best_first_tree_by`): a node's
        children at slot k are its K candidates, log-softmax of their scores after the node's own token (at
        ``temperature``), best first -> (log-probabilities, target ids)."""

        def children_of(k: int, token: int) -> tuple[list[float], list[int]]:
            lp, order = torch.log_softmax(self.scores(k, token) / temperature, dim=-1).sort(descending=True)
            return lp.tolist(), [self.token(k, j) for j in order.tolist()]

        return children_of
