"""Target quirks that change what a served drafter sees, measured on the loaded target (any family).

A DFlash drafter borrows the target's token embedding and LM head. The same checkpoint then sees
different inputs or scores depending on where a server applies each target quirk:

- **embedding transform** (Gemma family: x sqrt(hidden_size)): HF applies it *inside* the embedding
  module, vLLM's native classes *outside*, so vLLM hands the drafter unscaled rows: nothing errors,
  acceptance silently collapses. Measured here by running the target's embedding module against its
  raw weight rows; when they differ, served formats ship the embedding table exactly as the module
  produces it (``embed_tokens.weight``), which vLLM keeps separate from the target's.
- **tied LM head**: the drafter must keep using the target's head, never a head tied to a shipped
  (pre-scaled) embedding table: exported configs say ``tie_word_embeddings: false``.
- **final norm**: every reader applies the drafter's own ``norm`` and then the target's LM head,
  never the target's final norm (flashdraft does the same); nothing to translate, recorded.
- **logit soft-capping**: servers score drafts without the target's cap; tanh is monotonic, so
  greedy drafts are unchanged (recorded as a note; draft probabilities differ under sampling).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

import torch

from flashdraft.models.target import Target

PROBE_IDS = 64


@dataclass
class TargetQuirks:
    family: str  # HF model_type of the target's text config
    embed_transform: bool  # the embedding module output != its raw weight rows
    embed_scale: float | None  # the factor when the transform is a pure scale, else None
    tied_lm_head: bool
    final_norm: str  # class name of the target's final norm (applied by no reader to drafter outputs)
    logit_softcap: float | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _probe_ids(vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (PROBE_IDS,), generator=g)


@torch.no_grad()
def measure_quirks(target: Target) -> TargetQuirks:
    """Run the checks on ``target``; every family goes through the same measurements."""
    emb = target.model.get_input_embeddings()
    ids = _probe_ids(target.vocab_size).to(emb.weight.device)
    out = emb(ids[None])[0].float()  # [n, d] what HF feeds the drafter
    raw = emb.weight[ids].float()  # [n, d] the table as a server's plain lookup reads it
    transform = not torch.equal(out, raw)
    scale = None
    if transform:
        nz = raw.abs() > 1e-6
        ratio = (out[nz] / raw[nz]).median()
        if torch.allclose(out, raw * ratio, rtol=1e-2, atol=1e-5):
            scale = float(ratio)
    cfg = target.config
    head = target.model.get_output_embeddings()
    tied = bool(getattr(cfg, "tie_word_embeddings", False)) or (
        head is not None and head.weight.data_ptr() == emb.weight.data_ptr())
    norm = getattr(target.model.get_decoder(), "norm", None)
    cap = getattr(cfg, "final_logit_softcapping", None)
    q = TargetQuirks(family=str(getattr(cfg, "model_type", "unknown")), embed_transform=transform,
                     embed_scale=scale, tied_lm_head=tied, final_norm=type(norm).__name__ if norm is not None else "none",
                     logit_softcap=float(cap) if cap else None)
    if transform:
        q.notes.append(
            f"target embedding module transforms its rows (scale {scale if scale is not None else 'non-linear'}): "
            "served formats ship the transformed table as embed_tokens.weight")
    if tied:
        q.notes.append("target ties its LM head to the embedding: exported drafters keep tie_word_embeddings=false "
                       "so a shipped embedding table never becomes their head")
    if q.logit_softcap:
        q.notes.append(f"target soft-caps logits at {q.logit_softcap}: servers draft without the cap; greedy drafts "
                       "are unchanged (tanh is monotonic), draft probabilities differ under sampling")
    return q


@torch.no_grad()
def served_embedding_table(target: Target, dtype: torch.dtype) -> torch.Tensor:
    """The full table [vocab, d] exactly as the target's embedding module produces it in ``dtype``
    (the module itself is run, so any family's transform is reproduced bit for bit)."""
    emb = copy.deepcopy(target.model.get_input_embeddings()).to(device="cpu", dtype=dtype)
    ids = torch.arange(target.vocab_size)
    rows = [emb(ids[i:i + 65536][None])[0] for i in range(0, ids.numel(), 65536)]  # chunks of [<=65536, d]
    return torch.cat(rows).to(dtype).contiguous()
