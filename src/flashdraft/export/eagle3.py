"""Exporters and importers of the EAGLE-3 family (``LlamaForCausalLMEagle3``) for vLLM's ``eagle3`` method:
``vllm`` (the flat Llama config) and ``speculators`` (the same tensors, the config nested as vllm-project/
speculators writes it; vLLM 0.32 served both with identical drafts). Importing reverses each step below
(see :class:`VLLMEagle3Importer`).

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

from flashdraft.export.conventions import CONVENTIONS, ConventionError
from flashdraft.export.formats import (ARCHITECTURES, Exported, Exporter, ExportError, Source, register_exporter,
                                       shipped_embedding, speculators_version, with_vocab_head)
from flashdraft.export.importers import (DERIVED, Importer, ImportError_, draft_target_ids, register_importer, rope_theta,
                                         t2d_from_d2t)
from flashdraft.export.quirks import served_embedding_table
from flashdraft.models.eagle3 import Eagle3Config, Eagle3Drafter
from flashdraft.models.target import Target

ARCHITECTURES[Eagle3Drafter.architecture] = "eagle3"


class Eagle3Exporter(Exporter):
    """The EAGLE-3 family's exporters read the folder's :class:`Eagle3Config`."""

    architecture = "eagle3"

    def read_config(self, path: Path) -> Eagle3Config:
        return Eagle3Drafter.load_config(path)


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
        tensors = with_vocab_head({k: v.contiguous() for k, v in src.tensors.items()}, src, notes)
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
            architectures=["Eagle3Speculator"], speculators_model_type="eagle3", speculators_version=speculators_version(),
            transformer_layer_config={k: v for k, v in flat.items() if k not in SPECULATORS_TOP},
            speculators_config={
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": c.max_depth}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": target_ref,
                             "architectures": list(getattr(tc, "architectures", None) or [])},
            })
        files.config = cfg
        # speculators' Eagle3DraftModel names the decoder layer layers.0 (vLLM reads either name)
        files.tensors = {("layers.0." + k.removeprefix("midlayer.") if k.startswith("midlayer.") else k): v
                         for k, v in files.tensors.items()}
        if "embed_tokens.weight" not in files.tensors:  # speculators 0.9 fills a missing table only where it is NaN:
            # elsewhere its Eagle3DraftModel keeps uninitialised memory as the embedding
            files.tensors["embed_tokens.weight"] = served_embedding_table(target, src.serve_dtype)
            files.notes.append(f"shipped embed_tokens.weight [{target.vocab_size}, {target.hidden_size}]: speculators' "
                               "Eagle3DraftModel does not load it from the verifier unless its own table is NaN")
        files.notes.append(f"speculators layout: norm_before_residual false written (the speculators reader defaults "
                           f"to true); speculative_tokens {c.max_depth} (the drafter's chain depth); the decoder "
                           "layer as layers.0.* (speculators' own class reads no midlayer.*)")
        return files


# ---- import: EAGLE-3 checkpoints (flashdraft's exports, vLLM / SpecForge / speculators ones) ---------------

# Switches of vLLM's EAGLE-3 reader that flashdraft's layer does not have: refused when true.
UNSUPPORTED_SWITCHES = {
    "norm_before_fc": "one RMSNorm over the concatenated features before fc",
    "fc_norm": "one RMSNorm per target feature before fc",
    "norm_output": "each step feeds back the post-norm output",
}
# Fields written for vLLM's reader only; flashdraft keeps the same facts in eagle3_config / eagle_config.
VLLM_ONLY = ("eagle_aux_hidden_state_layer_ids", "norm_before_residual", *UNSUPPORTED_SWITCHES)
# Top-level fields of a speculators eagle3 config.json that vLLM's reader folds into the Llama config.
SPECULATORS_FIELDS = ("draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "torch_dtype",
                      "norm_before_residual", *UNSUPPORTED_SWITCHES)


def _layer_ids(flat: dict, eagle: dict, inner: dict, num_target_layers: int, notes: list[str]) -> list[int]:
    """flashdraft ids from every field that states them (all must agree); none: vLLM's default aux layers."""
    vllm = CONVENTIONS["vllm"]
    stated = {"eagle_aux_hidden_state_layer_ids": (flat.get("eagle_aux_hidden_state_layer_ids"), vllm),
              "eagle_config.eagle_aux_hidden_state_layer_ids": (eagle.get("eagle_aux_hidden_state_layer_ids"), vllm),
              "eagle3_config.target_layer_ids": (inner.get("target_layer_ids"), CONVENTIONS["flashdraft"])}
    found = {}
    for name, (ids, conv) in stated.items():
        if ids is not None:
            try:
                found[name] = (list(ids), conv.from_file(ids))
            except ConventionError as e:
                raise ImportError_(str(e) if name == conv.field else f"{name}: {e}") from None
    if len({tuple(v[1]) for v in found.values()}) > 1:
        said = "; ".join(f"{k} {raw} = flashdraft ids {ids}" for k, (raw, ids) in found.items())
        raise ImportError_(f"layer ids disagree: {said}. vLLM ids (input of layer j) are flashdraft ids (output of "
                           "layer i) + 1; fix the field that is off")
    if found:
        return next(iter(found.values()))[1]
    L = num_target_layers
    ids = vllm.from_file([2, L // 2, L - 3])  # vLLM's default when a checkpoint names no aux layers
    notes.append(f"no layer ids in config.json: vLLM's default aux layers [2, {L // 2}, {L - 3}] = flashdraft ids {ids}")
    return ids


def eagle3_config(flat: dict, residual_normed_by_default: bool, depth: int | None, target: Target | None,
                  notes: list[str]) -> dict:
    """A flat (vLLM-layout) EAGLE-3 config dict -> flashdraft's :class:`Eagle3Config` dict. ``residual_normed_by_default``:
    what the layout's vLLM reader assumes when ``norm_before_residual`` is absent; ``depth``: a chain depth the
    layout states elsewhere (speculators' speculative_tokens)."""
    eagle = dict(flat.get("eagle_config") or {})
    if flat.get("norm_before_residual", residual_normed_by_default):
        said = "is true" if "norm_before_residual" in flat else "is absent, which vLLM reads as true for this layout"
        raise ImportError_(f"norm_before_residual {said}: the decoder layer's residual would be the normed feature, "
                           "flashdraft's is the un-normed fc output; such a drafter cannot run here (write "
                           "norm_before_residual false only if it was trained with the un-normed residual)")
    for k, what in UNSUPPORTED_SWITCHES.items():
        if flat.get(k) or eagle.get(k):
            raise ImportError_(f"{k} is true ({what}): flashdraft's EAGLE-3 layer has no such step; serve the drafter "
                               f"with vLLM, or retrain it without {k}")
    if eagle.get("use_aux_hidden_state") is False:
        raise ImportError_("eagle_config.use_aux_hidden_state is false: the drafter reads the last hidden state "
                           "(EAGLE-1/2), not fused target layers; only EAGLE-3 drafters import")
    if flat.get("model_type", "llama") != "llama":
        raise ImportError_(f"model_type {flat['model_type']!r}: flashdraft's EAGLE-3 decoder layer is Llama's (no q/k "
                           "norms); only model_type 'llama' imports")
    cfg = {k: v for k, v in flat.items() if k not in VLLM_ONLY}
    cfg.update(architectures=[Eagle3Drafter.architecture], model_type="llama")
    if cfg.get("num_target_layers") is None:
        if target is None:
            raise ImportError_("config.json has no num_target_layers; pass --target so it is read from the target")
        cfg["num_target_layers"] = target.num_layers
    inner = dict(cfg.get("eagle3_config") or {})
    inner["target_layer_ids"] = _layer_ids(flat, eagle, inner, cfg["num_target_layers"], notes)
    if "max_depth" not in inner and depth is not None:
        inner["max_depth"] = depth
    cfg["eagle3_config"] = inner
    cfg["eagle_config"] = {k: v for k, v in eagle.items() if k not in VLLM_ONLY}  # aux ids rewritten on validation
    if cfg.get("draft_vocab_size") is None:  # vLLM: the full vocabulary
        cfg["draft_vocab_size"] = cfg.get("vocab_size")
    if cfg.get("target_hidden_size") is None:
        cfg["target_hidden_size"] = cfg.get("hidden_size")
    if cfg.get("num_key_value_heads") is None:  # HF LlamaConfig's defaults for fields older files omit
        cfg["num_key_value_heads"] = cfg.get("num_attention_heads")
    if cfg.get("head_dim") is None and cfg.get("num_attention_heads"):
        cfg["head_dim"] = cfg.get("hidden_size", 0) // cfg["num_attention_heads"]
    rope_theta(cfg)
    return cfg


def _check_shipped_table(table: torch.Tensor, target: Target | None, notes: list[str]) -> None:
    """A shipped ``embed_tokens.weight`` is dropped only when it is what the target's embedding module outputs."""
    if target is None:
        notes.append("dropped embed_tokens.weight unchecked (pass --target to check it is the target's embedding output)")
        return
    ref = served_embedding_table(target, table.dtype).float()  # [V, d]
    if ref.shape != table.shape or float((table.float() - ref).norm()) > 1e-2 * float(ref.norm()):
        raise ImportError_(f"embed_tokens.weight {list(table.shape)} is not the output of target {target.name}'s "
                           "embedding module, which flashdraft's EAGLE-3 drafters embed with; the drafter was made with "
                           "another table: import it for the target it was trained with")
    notes.append("dropped embed_tokens.weight (the target's embedding output; flashdraft runs the target's module)")


def _vocab_state(t: dict[str, torch.Tensor], cfg: Eagle3Config, target: Target | None,
                 notes: list[str]) -> dict[str, torch.Tensor]:
    """lm_head [Vd, d], d2t [Vd], t2d [V] as flashdraft's draft vocabulary holds them."""
    V, Vd = cfg.vocab_size, cfg.draft_vocab_size
    head = t.get("lm_head.weight")
    if head is None:
        if Vd != V:
            raise ImportError_(f"no lm_head.weight for a reduced draft vocabulary (draft_vocab_size {Vd} < vocab_size "
                               f"{V}); the checkpoint lacks the drafter's head [{Vd}, hidden_size]")
        if target is None:
            raise ImportError_("no lm_head.weight (vLLM then shares the target's LM head); pass --target so the "
                               "target's head is copied in")
        head = target.model.get_output_embeddings().weight.detach().to("cpu", t["fc.weight"].dtype).clone()  # [V, d]
        notes.append("no lm_head.weight: the target's LM head copied in (vLLM shares it for such a checkpoint)")
    if head.shape[0] != Vd:
        raise ImportError_(f"lm_head.weight has {head.shape[0]} rows but draft_vocab_size is {Vd}; set "
                           "draft_vocab_size to the head's rows")
    d2t = t.get("d2t")
    if d2t is None:
        if Vd != V:
            raise ImportError_(f"draft_vocab_size {Vd} < vocab_size {V} but no d2t maps draft ids to target ids; ship "
                               f"d2t [{Vd}] (target id = draft id + d2t), or set draft_vocab_size to {V} for a "
                               "full-vocabulary head in target-id order")
        d2t = torch.zeros(V, dtype=torch.long)  # [V] the identity map
        notes.append("full vocabulary (no d2t/t2d): lm_head rows in target-id order, d2t = 0, t2d all true")
    d2t = d2t.long().flatten()
    if d2t.numel() != Vd:
        raise ImportError_(f"d2t has {d2t.numel()} entries but draft_vocab_size is {Vd}; they must be equal")
    ids = draft_target_ids(d2t)  # [Vd] draft id -> target id
    if int(ids.min()) < 0 or int(ids.max()) >= V or ids.unique().numel() != Vd:
        raise ImportError_(f"d2t maps draft ids outside the target ids 0..{V - 1} or two draft ids to one target id "
                           "(target id = draft id + d2t[draft id] must be distinct); rebuild d2t")
    t2d = t2d_from_d2t(d2t, V)  # [V]
    shipped = t.get("t2d")
    if shipped is not None and not torch.equal(shipped.bool().flatten(), t2d):
        raise ImportError_("t2d does not mark exactly the target ids d2t maps to; delete t2d (it is rebuilt from d2t) "
                           "or fix d2t")
    return {"lm_head.weight": head.contiguous(), "d2t": d2t.contiguous(), "t2d": t2d}


class Eagle3Importer(Importer):
    architecture = "eagle3"
    config_class = Eagle3Config
    architectures = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
    speculators_type = "eagle3"

    def weights(self, tensors, cfg, target, notes):
        tensors = {k.removeprefix("model."): v for k, v in tensors.items()}
        out = {}
        for k, v in tensors.items():
            k = "midlayer." + k.removeprefix("layers.0.") if k.startswith("layers.0.") else k  # vLLM's own name
            if k == "embed_tokens.weight":
                _check_shipped_table(v, target, notes)
            elif k in DERIVED:
                notes.append(f"dropped {k} (a copy of the verifier's; flashdraft runs the target's own)")
            elif k not in ("lm_head.weight", "d2t", "t2d"):
                out[k] = v.contiguous()
        out.update(_vocab_state(tensors, cfg, target, notes))
        return out

    def _mask_note(self, mask_token_id: int | None, notes: list[str]) -> None:
        if mask_token_id is not None:
            notes.append("--mask-token-id ignored: EAGLE-3 drafters have no mask token")


@register_importer
class VLLMEagle3Importer(Eagle3Importer):
    """The flat layout (flashdraft's ``--to vllm``, SpecForge, EAGLE's own): layer ids back from vLLM's
    convention, ``norm_before_residual`` absent = false (vLLM's Llama reader), d2t/t2d -> the draft vocabulary,
    a full-vocabulary head (no maps) -> the identity draft vocabulary, the shipped embedding dropped."""

    format = "vllm"

    def detects(self, raw):
        return "speculators_model_type" not in raw

    def config(self, raw, target, mask_token_id, notes):
        self._mask_note(mask_token_id, notes)
        return eagle3_config(dict(raw), False, None, target, notes)


@register_importer
class SpeculatorsEagle3Importer(Eagle3Importer):
    """The speculators layout: the Llama fields from ``transformer_layer_config``, the EAGLE-3 ones from the top
    level (``norm_before_residual`` absent = true, as vLLM's speculators reader takes it), the chain depth from
    ``speculators_config.proposal_methods``."""

    format = "speculators"

    def detects(self, raw):
        return "speculators_model_type" in raw

    def config(self, raw, target, mask_token_id, notes):
        self._mask_note(mask_token_id, notes)
        layer = dict(raw.get("transformer_layer_config") or {})
        if not layer:
            raise ImportError_("speculators config has no transformer_layer_config; it holds the drafter's Llama fields")
        flat = {**layer, **{k: raw[k] for k in SPECULATORS_FIELDS if k in raw}}
        methods = (raw.get("speculators_config") or {}).get("proposal_methods") or [{}]
        return eagle3_config(flat, True, methods[0].get("speculative_tokens"), target, notes)
