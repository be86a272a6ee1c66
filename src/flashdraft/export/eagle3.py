"""Exporters of the EAGLE-3 family (``LlamaForCausalLMEagle3``) to vLLM's ``eagle3`` method: ``vllm``
(the flat Llama config) and ``speculators`` (the same tensors, the config nested as vllm-project/
speculators writes it; vLLM 0.32 served both with identical drafts).

The flashdraft folder already carries vLLM's tensor names (``fc``, ``midlayer.*``, ``norm``,
``lm_head``, ``d2t``, ``t2d``) and Llama config fields; the export makes explicit what vLLM 0.32's
``llama_eagle3.py`` would otherwise take from defaults, and translates what differs:

- **layer ids**: flashdraft's ``eagle3_config.target_layer_ids`` (layer outputs) become
  ``eagle_aux_hidden_state_layer_ids`` (vLLM: the residual stream entering layer j = flashdraft id + 1),
  written at the top level (where vLLM's model runner looks first) and in ``eagle_config``;
- **residual**: ``norm_before_residual: false`` (the layer's residual is the un-normed fused feature),
  which vLLM's speculators path would otherwise default to true;
- **vocabulary**: a reduced draft vocabulary ships ``lm_head`` [Vd, d] + ``d2t`` (vLLM ignores
  ``t2d``); a full one ships ``lm_head`` in target-id order and no maps (vLLM has no d2t parameter then);
- **embedding**: a target whose embedding module transforms its rows (Gemma: x sqrt(d)) gets the
  transformed table as ``embed_tokens.weight``, which vLLM keeps separate from the target's, so the
  drafter reads what HF's embedding module outputs under every ``model_impl``; without a transform
  no table is shipped and vLLM shares the target's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from flashdraft.export.conventions import CONVENTIONS
from flashdraft.export.formats import (ARCHITECTURES, Exported, Exporter, ExportError, Source, register_exporter,
                                       shipped_embedding)
from flashdraft.models.eagle3 import Eagle3Config, Eagle3Drafter

ARCHITECTURES[Eagle3Drafter.architecture] = "eagle3"


class Eagle3Exporter(Exporter):
    """The EAGLE-3 family's exporters read the folder's :class:`Eagle3Config`."""

    architecture = "eagle3"

    def read_config(self, path: Path) -> Eagle3Config:
        return Eagle3Drafter.load_config(path)


def _vocab_tensors(src: Source, notes: list[str]) -> dict[str, torch.Tensor]:
    """lm_head (+ d2t) as vLLM reads them for this drafter's vocabulary."""
    c: Eagle3Config = src.config
    t = src.tensors
    for k in ("lm_head.weight", "d2t"):
        if k not in t:
            raise ExportError(f"drafter {src.path} has no {k!r} tensor; re-save it with Eagle3Drafter.save_pretrained")
    head, d2t = t["lm_head.weight"], t["d2t"].long()  # [Vd, d], [Vd]
    if head.shape[0] != c.draft_vocab_size or d2t.numel() != c.draft_vocab_size:
        raise ExportError(f"drafter {src.path}: lm_head rows {head.shape[0]} / d2t {d2t.numel()} do not match "
                          f"draft_vocab_size {c.draft_vocab_size}; re-save the drafter")
    target_ids = torch.arange(c.draft_vocab_size) + d2t  # [Vd] draft id -> target id
    if c.draft_vocab_size < c.vocab_size:
        notes.append(f"reduced vocabulary: lm_head [{c.draft_vocab_size}, {c.hidden_size}] + d2t (vLLM scatters the "
                     "draft logits into the target vocabulary; it ignores t2d, shipped for other readers)")
        return {"lm_head.weight": head.contiguous(), "d2t": d2t.contiguous(), "t2d": t["t2d"].bool().contiguous()}
    if sorted(target_ids.tolist()) != list(range(c.vocab_size)):
        raise ExportError(f"drafter {src.path}: d2t does not map the draft vocabulary onto the {c.vocab_size} target ids "
                          "one to one; re-save the drafter")
    full = torch.empty_like(head)
    full[target_ids] = head  # [V, d] rows in target-id order
    notes.append("full vocabulary: lm_head in target-id order, no d2t/t2d (vLLM has no draft-id map then)")
    return {"lm_head.weight": full.contiguous()}


@register_exporter
class VLLMEagle3Exporter(Eagle3Exporter):
    format = "vllm"
    description = ("vLLM speculative_config method='eagle3' (Eagle3LlamaForCausalLM: aux ids = flashdraft ids + 1, "
                   "draft_vocab_size + d2t, own embed table when the target transforms its embeddings)")

    def build(self, src, quirks, target, target_ref):
        c: Eagle3Config = src.config
        ids = c.target_layer_ids
        aux = CONVENTIONS["vllm"].to_file(ids)
        cfg = c.model_dump(mode="json")
        cfg.update(architectures=["LlamaForCausalLMEagle3"], model_type="llama", tie_word_embeddings=False,
                   norm_before_residual=False, eagle_aux_hidden_state_layer_ids=aux,
                   eagle_config={**c.eagle_config, "eagle_aux_hidden_state_layer_ids": aux,
                                 "use_aux_hidden_state": True},
                   torch_dtype=str(src.dtype).removeprefix("torch."))
        notes = [f"layer ids: eagle3_config.target_layer_ids {ids} (flashdraft: layer outputs) = "
                 f"eagle_aux_hidden_state_layer_ids {aux} (vLLM: input of layer j)",
                 "norm_before_residual false: the decoder layer's residual is the un-normed fused feature"]
        tensors = {k: v.contiguous() for k, v in src.tensors.items() if k not in ("lm_head.weight", "d2t", "t2d")}
        tensors.update(_vocab_tensors(src, notes))
        table = shipped_embedding(src, quirks, target, notes)
        if not table:
            notes.append("no embed_tokens shipped: vLLM shares the target's embedding (it transforms nothing)")
        tensors.update(table)
        return Exported(cfg, tensors, notes,
                        speculative_config={"method": "eagle3", "num_speculative_tokens": c.max_depth})


# Top-level fields of the vllm export that the speculators layout keeps outside transformer_layer_config.
SPECULATORS_TOP = ("architectures", "draft_vocab_size", "target_hidden_size", "norm_before_residual",
                   "eagle_aux_hidden_state_layer_ids", "torch_dtype")


@register_exporter
class SpeculatorsEagle3Exporter(Eagle3Exporter):
    format = "speculators"
    description = ("vllm-project/speculators eagle3 (speculators_config, transformer_layer_config, aux ids = "
                   "flashdraft ids + 1); vLLM serves the folder alone, the verifier named inside")

    def build(self, src, quirks, target, target_ref):
        files = VLLMEagle3Exporter().build(src, quirks, target, target_ref)
        flat, c = files.config, src.config
        tc = target.config
        cfg = {k: flat[k] for k in SPECULATORS_TOP}
        cfg.update(
            architectures=["Eagle3Speculator"], speculators_model_type="eagle3", speculators_version="0.3.0",
            transformer_layer_config={k: v for k, v in flat.items() if k not in SPECULATORS_TOP},
            speculators_config={
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": c.max_depth}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": target_ref,
                             "architectures": list(getattr(tc, "architectures", None) or [])},
            })
        files.config = cfg
        files.notes.append(f"speculators layout: norm_before_residual false written (the speculators reader defaults "
                           f"to true); speculative_tokens {c.max_depth} (the drafter's chain depth)")
        return files
