"""Exporters, one per (architecture, format), and the ``export_drafter`` entry point.

An exporter validates first (a format that cannot express the drafter raises :class:`ExportError`
naming the field and the fix, before any file is written), then returns the files; the folder is
written atomically. Registered for ``dflash``: ``zlab``, ``vllm``, ``speculators``, ``sglang``; for
``eagle3`` (:mod:`flashdraft.export.eagle3`): ``vllm``, ``speculators``. A family plugs in by naming its ``config.json``
architecture in :data:`ARCHITECTURES` and registering ``(family, format)`` exporters with
:func:`register_exporter`; :func:`export_drafter` picks the exporter through both, never by family name.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from flashdraft.errors import FlashdraftError
from flashdraft.export.conventions import CONVENTIONS
from flashdraft.export.quirks import TargetQuirks, measure_quirks, served_embedding_table
from flashdraft.io import atomic_replace_dir, check_publish_dir
from flashdraft.models.dflash import DFlashConfig, DFlashDrafter
from flashdraft.models.drafter import DrafterError, drafter_architecture, load_drafter, read_safetensors
from flashdraft.models.target import Target, portable_target_name

MANIFEST = "flashdraft_export.json"
SPECULATORS_VERSION = "0.9.0"  # the newest speculators release whose DFlash / EAGLE-3 files these exports are checked against
# config.json architectures[0] -> exporter registry key (a family module adds its own entry)
ARCHITECTURES: dict[str, str] = {"DFlashDraftModel": "dflash"}
# Target families whose HF embedding transform SGLang also applies inside its embedding module
# (read in SGLang's gemma3_causal.py); SGLang's DFlash model cannot carry its own table.
SGLANG_EMBED_IN_MODULE = {"gemma3_text", "gemma3"}
# A drafter's own head over its draft vocabulary and the maps between draft and target ids
VOCAB_TENSORS = ("lm_head.weight", "d2t", "t2d")


def speculators_version() -> str:
    """The speculators format version an export records: the installed speculators', else the newest supported."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("speculators")
    except PackageNotFoundError:
        return SPECULATORS_VERSION


class ExportError(FlashdraftError, ValueError):
    """A drafter a format cannot express, or bad export input; the message names both and the fix."""


@dataclass
class Source:
    """A flashdraft drafter folder as read from disk: config and raw tensors (dtype kept)."""

    path: Path
    config: Any  # what the family's exporters read: DFlashConfig for dflash, the config.json dict otherwise
    tensors: dict[str, torch.Tensor]
    serve_dtype: torch.dtype = torch.bfloat16  # the dtype the server runs (a shipped embedding table's)
    drafter: Any = None  # the family object (load_drafter, unbound): target_layer_ids, max_depth, check_fits

    @property
    def dtype(self) -> torch.dtype:
        if "fc.weight" in self.tensors:
            return self.tensors["fc.weight"].dtype
        return next(t.dtype for t in self.tensors.values() if t.is_floating_point())


@dataclass
class Exported:
    config: dict
    tensors: dict[str, torch.Tensor]
    notes: list[str] = field(default_factory=list)
    extra_files: dict[str, bytes] = field(default_factory=dict)
    # vLLM's speculative_config for this folder without "model" (serve-cmd reads it from the manifest)
    speculative_config: dict | None = None


class Exporter(ABC):
    architecture = ""  # registry key of the family (a value of ARCHITECTURES)
    format = ""
    description = ""

    def read_config(self, path: Path) -> Any:
        """The source folder's config as this family's exporters read it (default: the config.json dict)."""
        return json.loads((Path(path) / "config.json").read_text())

    def read(self, path: str | Path) -> Source:
        path = Path(path)
        tensors = load_tensors(path)
        tensors.pop("embed_tokens.weight", None)  # a served copy of the target's table, rebuilt on export
        return Source(path, self.read_config(path), tensors)

    @abstractmethod
    def build(self, src: Source, quirks: TargetQuirks, target: Target, target_ref: str) -> Exported:
        """Validate and return the files (raise ExportError before returning if not expressible)."""


EXPORTERS: dict[tuple[str, str], Exporter] = {}


def register_exporter(cls: type[Exporter]) -> type[Exporter]:
    EXPORTERS[(cls.architecture, cls.format)] = cls()
    return cls


def formats_for(architecture: str) -> list[str]:
    return sorted(f for a, f in EXPORTERS if a == architecture)


def load_tensors(path: Path, error=ExportError) -> dict[str, torch.Tensor]:
    """Every tensor of the ``*.safetensors`` files in the folder ``path`` (``error`` raised when there are none)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise error(f"no .safetensors weights in {path}; pass a drafter folder written by `flashdraft train` "
                    "(.bin checkpoints: convert them to safetensors first)")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(read_safetensors(f, error))
    return tensors


class DFlashExporter(Exporter):
    """The DFlash family's exporters read the folder's :class:`DFlashConfig`."""

    architecture = "dflash"

    def read_config(self, path: Path) -> DFlashConfig:
        return DFlashDrafter.load_config(path)


def _body(src: Source) -> dict[str, torch.Tensor]:
    """The drafter's own weights (and the reduced-vocabulary head and maps when it has them)."""
    return {k: v.contiguous() for k, v in src.tensors.items()}


def with_vocab_head(tensors: dict[str, torch.Tensor], src: Source, notes: list[str]) -> dict[str, torch.Tensor]:
    """``tensors`` with the own LM head (+ d2t, t2d) of a drafter with a draft vocabulary as vLLM reads them: a
    reduced one as lm_head [Vd, d] + d2t; one as large as the target's as lm_head in target-id order and no maps
    (vLLM builds no draft-id map when draft_vocab_size equals the target's vocabulary, and refuses a d2t then)."""
    return {**{k: v for k, v in tensors.items() if k not in VOCAB_TENSORS}, **_vocab_head(src, notes)}


def _vocab_head(src: Source, notes: list[str]) -> dict[str, torch.Tensor]:
    c = src.config
    t = src.tensors
    for k in ("lm_head.weight", "d2t"):
        if k not in t:
            raise ExportError(f"drafter {src.path} has no {k!r} tensor; re-save it with its save_pretrained")
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


def _reject_reduced_vocab(src: Source, fmt: str, reader: str) -> None:
    if src.config.draft_vocab_size is not None:
        raise ExportError(
            f"drafter {src.path} has a reduced draft vocabulary (draft_vocab_size {src.config.draft_vocab_size}, "
            f"own lm_head + d2t), which the {fmt} format cannot express: {reader} always scores with the target's "
            "LM head. Export it with --to vllm or --to speculators, or train it without --draft-vocab")


def _zlab_config(src: Source) -> dict:
    cfg = src.config.model_dump(mode="json")
    cfg.pop("block_hints", None)  # flashdraft's own decoding (see export_drafter's note); only vLLM with the plugin fills them
    cfg["tie_word_embeddings"] = False
    cfg["torch_dtype"] = str(src.dtype).removeprefix("torch.")
    return cfg


def shipped_embedding(src: Source, quirks: TargetQuirks, target: Target, notes: list[str]) -> dict[str, torch.Tensor]:
    """``{"embed_tokens.weight": table}`` when the target transforms its embeddings (else {}), with the note."""
    if not quirks.embed_transform:
        return {}
    dtype = src.serve_dtype
    notes.append(f"shipped embed_tokens.weight [{target.vocab_size}, {target.hidden_size}] {dtype}: the target's "
                 f"embedding module output run in {dtype} (vLLM keeps it separate, so every model_impl feeds what HF feeds)")
    return {"embed_tokens.weight": served_embedding_table(target, dtype)}


@register_exporter
class ZLabExporter(DFlashExporter):
    format = "zlab"
    description = "z-lab DFlash (trust_remote_code auto_map dflash.DFlashDraftModel, dflash_config, block_size)"

    def build(self, src, quirks, target, target_ref):
        _reject_reduced_vocab(src, "z-lab", "z-lab's DFlashDraftModel")
        notes = ["z-lab code embeds with target.model.embed_tokens (HF module): no embedding table shipped"]
        return Exported(_zlab_config(src), _body(src), notes)


@register_exporter
class SGLangExporter(DFlashExporter):
    format = "sglang"
    description = "SGLang --speculative-algorithm DFLASH (z-lab files; SGLang captures before layer id + 1)"

    def build(self, src, quirks, target, target_ref):
        _reject_reduced_vocab(src, "SGLang", "SGLang's DFlashDraftModel (no embedding, no LM head)")
        if quirks.embed_transform and quirks.family not in SGLANG_EMBED_IN_MODULE:
            raise ExportError(
                f"target family {quirks.family!r} transforms its token embeddings (scale {quirks.embed_scale}) and "
                "SGLang's DFlash drafter cannot ship its own table, so it is not known to see what it was trained "
                "with; serve it with vLLM (--to vllm ships the table) or check SGLang's embedding module for this family")
        notes = ["SGLang's DFlash drafter borrows the target's embedding module"]
        if quirks.embed_transform:
            notes.append(f"SGLang's {quirks.family} applies the embedding scale inside its module (fp32 factor; HF rounds "
                         "it to the weight dtype): the drafter sees scaled rows")
        return Exported(_zlab_config(src), _body(src), notes)


@register_exporter
class VLLMExporter(DFlashExporter):
    format = "vllm"
    description = "vLLM speculative_config method='dflash' (explicit aux ids, draft_vocab_size + d2t, own embed table)"

    def build(self, src, quirks, target, target_ref):
        cfg = _zlab_config(src)
        ids = src.config.target_layer_ids
        cfg["eagle_aux_hidden_state_layer_ids"] = CONVENTIONS["vllm"].to_file(ids)
        notes = [f"layer ids: dflash_config.target_layer_ids {ids} (z-lab) = eagle_aux_hidden_state_layer_ids "
                 f"{cfg['eagle_aux_hidden_state_layer_ids']} (vLLM: input of layer j)"]
        lt = src.config.layer_types
        if "sliding_attention" in lt and "full_attention" in lt:
            notes.append("mixed sliding/full layers: vLLM needs VLLM_USE_V2_MODEL_RUNNER=1 (serve-cmd adds it)")
        tensors = _body(src)
        if src.config.draft_vocab_size is not None:
            tensors = with_vocab_head(tensors, src, notes)
        tensors.update(shipped_embedding(src, quirks, target, notes))
        if src.config.block_hints:  # flashdraft's vLLM plugin fills the draft slots as flashdraft decodes
            cfg["block_hints"] = src.config.block_hints
            notes.append(f"block_hints {src.config.block_hints!r} kept: with flashdraft installed beside vLLM its "
                         "plugin (vllm.general_plugins) writes prompt lookup's chain into the draft slots, as "
                         "`flashdraft decode --hints lookup` does; without it vLLM fills MASK: what --hints none "
                         "measures")
        return Exported(cfg, tensors, notes, speculative_config=_dflash_speculative_config(src))


def _dflash_speculative_config(src: Source) -> dict:
    # vLLM does not read block_size for DFlash: the whole block minus the bonus is always given
    return {"method": "dflash", "num_speculative_tokens": src.config.block_size - 1}


SPEC_TOP = ("architectures", "auto_map", "block_size", "dflash_config", "draft_vocab_size", "target_hidden_size",
            "torch_dtype")


@register_exporter
class SpeculatorsExporter(DFlashExporter):
    format = "speculators"
    description = "vllm-project/speculators (speculators_config, transformer_layer_config, aux ids = z-lab + 1)"

    def build(self, src, quirks, target, target_ref):
        c = src.config
        lt = c.layer_types
        if "sliding_attention" in lt and "full_attention" in lt:
            raise ExportError(
                f"drafter {src.path} mixes sliding (causal) and full (bidirectional) layers {lt}; the speculators format "
                "has one switch (sliding_window_non_causal) for all layers, so vLLM would run some layers with the "
                "wrong mask. Export with --to vllm or --to zlab instead")
        if c.draft_vocab_size is not None and c.draft_vocab_size >= c.vocab_size:
            raise ExportError(
                f"drafter {src.path} has its own LM head over the whole vocabulary (draft_vocab_size "
                f"{c.draft_vocab_size} = the target's): speculators replaces a full-vocabulary DFlash head with the "
                "verifier's on load, so its drafts would change. Export it with --to vllm")
        zl = _zlab_config(src)
        layer_cfg = {k: v for k, v in zl.items() if k not in SPEC_TOP}
        inner_extra = {k: v for k, v in zl["dflash_config"].items() if k not in ("mask_token_id", "target_layer_ids")}
        if inner_extra:
            layer_cfg["dflash_config"] = inner_extra
        tc = target.config
        cfg = {
            "architectures": ["DFlashDraftModel"],
            "speculators_model_type": "dflash",
            "speculators_version": speculators_version(),
            "transformer_layer_config": layer_cfg,
            "draft_vocab_size": c.draft_vocab_size or c.vocab_size,
            "target_hidden_size": c.target_hidden_size,
            "block_size": c.block_size,
            "aux_hidden_state_layer_ids": CONVENTIONS["speculators"].to_file(c.target_layer_ids),
            "mask_token_id": c.mask_token_id,
            "sample_from_anchor": False,
            "sliding_window_non_causal": "sliding_attention" not in lt,
            "speculators_config": {
                "algorithm": "dflash",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": c.block_size - 1}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": target_ref, "architectures": list(getattr(tc, "architectures", None) or [])},
            },
            "torch_dtype": zl["torch_dtype"],
        }
        notes = [f"aux_hidden_state_layer_ids {cfg['aux_hidden_state_layer_ids']} = z-lab ids {c.target_layer_ids} + 1",
                 "embedding and LM head are not shipped unless needed (speculators fills them from the verifier)"]
        tensors = _body(src)
        tensors.update(shipped_embedding(src, quirks, target, notes))
        return Exported(cfg, tensors, notes, speculative_config=_dflash_speculative_config(src))


@dataclass
class ExportReport:
    out: Path
    format: str
    notes: list[str]
    quirks: TargetQuirks


def export_drafter(src_dir: str | Path, fmt: str, out: str | Path, target: Target, target_ref: str | None = None,
                   modeling_file: str | Path | None = None, serve_dtype: str | None = None,
                   overwrite: bool = False) -> ExportReport:
    """Write the drafter folder ``src_dir`` in format ``fmt`` to ``out`` (atomically) for ``target``;
    ``serve_dtype`` (default: the drafter's own dtype) is the dtype a shipped embedding table is made in.
    ``out`` follows :func:`~flashdraft.io.check_publish_dir` (``overwrite`` to write into another's folder).
    The exporter is the one registered for (the family ``config.json`` names, ``fmt``)."""
    try:
        name = drafter_architecture(src_dir)
    except DrafterError as e:
        raise ExportError(str(e)) from None
    arch = ARCHITECTURES.get(name)
    if arch is None:
        raise ExportError(f"{src_dir}: architectures [{name!r}] is not one flashdraft exports "
                          f"(known: {sorted(ARCHITECTURES)})")
    exporter = EXPORTERS.get((arch, fmt))
    if exporter is None:
        raise ExportError(f"no exporter for a {arch} drafter to format {fmt!r}; choose one of {formats_for(arch)}")
    check_publish_dir(out, lambda d: (d / MANIFEST).is_file(), "an exported drafter", overwrite, inputs=[src_dir])
    src = exporter.read(src_dir)
    if serve_dtype is not None:
        dt = getattr(torch, serve_dtype, None)
        if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
            raise ExportError(f"--dtype {serve_dtype!r} is not a floating torch dtype; use bfloat16, float16 or float32")
        src.serve_dtype = dt
    else:
        src.serve_dtype = src.dtype
    src.drafter = load_drafter(src.path)  # refuses corrupt, edited or non-finite weights (DrafterError)
    try:
        src.drafter.check_fits(target)
    except ValueError as e:
        raise ExportError(f"drafter {src_dir} does not fit target {target.name}: {e}") from None
    quirks = measure_quirks(target)
    target_ref, renamed = portable_target_name(target_ref or target.name)
    files = exporter.build(src, quirks, target, target_ref)
    notes = quirks.notes + files.notes + ([renamed] if renamed else [])
    if getattr(src.config, "block_hints", None) and "block_hints" not in files.config:
        notes.append(f"block_hints {src.config.block_hints!r} dropped: {fmt} fills the draft slots with MASK, where this "
                     "drafter accepts what `flashdraft decode --hints none` measures, not what it does with hints")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        (tmp / "config.json").write_text(json.dumps(files.config, indent=2) + "\n")
        save_file(files.tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if modeling_file is not None:
            shutil.copyfile(modeling_file, tmp / "dflash.py")
        manifest = dict(format=fmt, architecture=arch, source=str(src.path), target=target_ref,
                        quirks=quirks.to_dict(), notes=notes)
        if files.speculative_config is not None:
            manifest["speculative_config"] = files.speculative_config
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        atomic_replace_dir(tmp, out, keep_foreign=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ExportReport(out, fmt, notes, quirks)
