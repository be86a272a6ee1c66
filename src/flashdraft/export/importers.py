"""``flashdraft import``: published drafters (DFlash: z-lab, vLLM-style, speculators; EAGLE-3: vLLM,
speculators) into flashdraft's folder.

The result is a plain flashdraft drafter folder (config.json + model.safetensors) that ``bench
decode``, ``run`` and ``train --init-from`` load. Tensors keep their dtype and bits; a shipped
embedding table or verifier copies (re-derived from the target at run time) are dropped; layer ids
are translated to flashdraft's convention (see :mod:`flashdraft.export.conventions`).

Importers are registered per (family, format), as exporters are: :func:`import_drafter` reads the
family from ``config.json`` (``speculators_model_type``, else ``architectures``) and the format from
``--from`` or the importer of that family whose :meth:`Importer.detects` the file; a family plugs in
with :func:`register_importer` (the EAGLE-3 ones live in :mod:`flashdraft.export.eagle3`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path

import torch
from pydantic import ValidationError
from safetensors.torch import save_file

from flashdraft.config import validation_message
from flashdraft.export.conventions import CONVENTIONS, ConventionError
from flashdraft.export.formats import MANIFEST, ExportError, load_tensors
from flashdraft.io import atomic_replace_dir, check_publish_dir
from flashdraft.models.dflash import DFlashConfig
from flashdraft.models.drafter import DrafterConfig, load_drafter
from flashdraft.models.target import Target, default_target_layer_ids

# Weights a served checkpoint may carry that flashdraft re-derives from the target.
DERIVED = ("embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight")
EXPORT_ONLY_KEYS = ("eagle_aux_hidden_state_layer_ids",)


class ImportError_(ExportError):
    """A checkpoint that cannot become a flashdraft drafter; the message names the field and the fix."""


class Importer(ABC):
    """Reads one (family, format) layout. ``architectures``: the ``config.json`` names of the family
    (flat layouts); ``speculators_type``: its ``speculators_model_type`` (speculators layouts)."""

    architecture = ""  # family key, as in flashdraft.export.formats.ARCHITECTURES
    format = ""
    config_class: type[DrafterConfig]  # the family's config.json model (its family_name is said in messages)
    architectures: tuple[str, ...] = ()
    speculators_type = ""

    @abstractmethod
    def detects(self, raw: dict) -> bool:
        """Whether ``--from auto`` picks this importer for the family's ``config.json`` ``raw``."""

    @abstractmethod
    def config(self, raw: dict, target: Target | None, mask_token_id: int | None, notes: list[str]) -> dict:
        """``raw`` -> flashdraft's config dict (``torch_dtype`` may stay in it)."""

    @abstractmethod
    def weights(self, tensors: dict[str, torch.Tensor], cfg: DrafterConfig, target: Target | None,
                notes: list[str]) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors -> the drafter's state under flashdraft's names."""


IMPORTERS: dict[tuple[str, str], Importer] = {}


def register_importer(cls: type[Importer]) -> type[Importer]:
    IMPORTERS[(cls.architecture, cls.format)] = cls()
    return cls


def _builtin_importers() -> None:
    from flashdraft.export import dflash2, eagle3  # noqa: F401  (registers the DFlash2 and EAGLE-3 importers)


def _read(src: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    p = src / "config.json"
    if not p.is_file():
        raise ImportError_(f"{p} not found; pass a checkpoint folder with config.json and *.safetensors")
    try:
        raw = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ImportError_(f"{p} is not valid JSON ({e}); pass a checkpoint folder as its trainer wrote it") from None
    if not isinstance(raw, dict):
        raise ImportError_(f"{p} holds {type(raw).__name__}, not a JSON object of config fields")
    return raw, load_tensors(src, ImportError_)


def detect_family(raw: dict) -> str:
    """The family key of ``config.json`` ``raw``: from ``speculators_model_type``, else ``architectures[0]``."""
    _builtin_importers()
    if "speculators_model_type" in raw:
        kind = raw["speculators_model_type"]
        known = {i.speculators_type: i.architecture for i in IMPORTERS.values() if i.speculators_type}
        if kind not in known:
            raise ImportError_(f"speculators_model_type {kind!r}: only {sorted(known)} import")
        return known[kind]
    archs = raw.get("architectures") or []
    known = {a: i.architecture for i in IMPORTERS.values() for a in i.architectures}
    if not archs or archs[0] not in known:
        raise ImportError_(f"config.json architectures {archs} name no drafter family flashdraft imports; "
                           f"known: {sorted(known)} (set architectures to the family the checkpoint holds)")
    return known[archs[0]]


def pick_importer(raw: dict, fmt: str = "auto") -> Importer:
    """The importer for ``raw``'s family and ``fmt`` (``auto``: the one that detects the file)."""
    family = detect_family(raw)
    mine = {f: i for (a, f), i in IMPORTERS.items() if a == family}
    if fmt == "auto":
        found = [i for i in mine.values() if i.detects(raw)]
        if len(found) != 1:
            raise ImportError_(f"cannot tell the format of this {family} checkpoint; pass --from, one of {sorted(mine)}")
        return found[0]
    if fmt not in mine:
        raise ImportError_(f"unknown format {fmt!r} for a {family} checkpoint; use auto or one of {sorted(mine)}")
    return mine[fmt]


def draft_target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """d2t [Vd] (target id = draft id + d2t[draft id]) -> the target ids [Vd]."""
    return d2t.long().flatten() + torch.arange(d2t.numel())


def t2d_from_d2t(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The [vocab_size] bool mask of the target ids that d2t maps draft ids to."""
    t2d = torch.zeros(vocab_size, dtype=torch.bool)  # [V]
    t2d[draft_target_ids(d2t)] = True
    return t2d


def rope_theta(cfg: dict) -> None:
    """Fold ``rope_parameters`` into ``rope_theta``; refuse RoPE scaling (flashdraft runs default RoPE)."""
    rp = cfg.pop("rope_parameters", None)
    if isinstance(rp, dict):
        if rp.get("rope_type", "default") != "default":
            raise ImportError_(f"rope_parameters {rp}: flashdraft drafters use default RoPE only")
        cfg.setdefault("rope_theta", rp.get("rope_theta", 1_000_000.0))
    if cfg.get("rope_scaling"):
        raise ImportError_(f"rope_scaling {cfg['rope_scaling']}: flashdraft drafters use default RoPE only")


def zlab_config(cfg: dict, target: Target | None, mask_token_id: int | None) -> dict:
    """Normalise a z-lab / vLLM-style DFlash config.json (older and newer layouts) to flashdraft's."""
    cfg = {k: v for k, v in cfg.items() if k not in EXPORT_ONLY_KEYS}
    inner = dict(cfg.get("dflash_config") or {})
    if "block_size" not in cfg and "block_size" in inner:
        cfg["block_size"] = inner.pop("block_size")
    if mask_token_id is not None:
        inner["mask_token_id"] = mask_token_id
    if "mask_token_id" not in inner:
        raise ImportError_("config.json has no dflash_config.mask_token_id (older z-lab checkpoints added <|MASK|> "
                           "to the tokenizer); pass --mask-token-id with that token's id in the target vocabulary")
    if "num_target_layers" not in cfg:
        if target is None:
            raise ImportError_("config.json has no num_target_layers; pass --target so it is read from the target")
        cfg["num_target_layers"] = target.num_layers
    if "target_layer_ids" not in inner:  # z-lab's default rule, before the field existed
        inner["target_layer_ids"] = default_target_layer_ids(cfg["num_target_layers"], cfg["num_hidden_layers"])
    cfg["dflash_config"] = inner
    cfg.setdefault("target_hidden_size", cfg.get("hidden_size"))
    rope_theta(cfg)
    return cfg


def _check_vllm_ids(raw: dict) -> None:
    aux = raw.get("eagle_aux_hidden_state_layer_ids")
    ids = (raw.get("dflash_config") or {}).get("target_layer_ids")
    if aux is not None and ids is not None and CONVENTIONS["vllm"].from_file(aux) != list(ids):
        raise ImportError_(
            f"eagle_aux_hidden_state_layer_ids {aux} (vLLM: input of layer j) and dflash_config.target_layer_ids {ids} "
            "(z-lab: output of layer i) disagree; they must differ by exactly 1. Fix one of them")


def speculators_config(raw: dict) -> dict:
    """A speculators DFlash config.json -> flashdraft's config dict."""
    if raw.get("sample_from_anchor"):
        raise ImportError_("sample_from_anchor is true: block slot 0 is drafted, flashdraft's slot 0 is the known "
                           "anchor; such a drafter cannot be run as a DFlash block drafter here")
    layer = dict(raw.get("transformer_layer_config") or {})
    if not layer:
        raise ImportError_("speculators config has no transformer_layer_config")
    lt = layer.get("layer_types") or []
    if "sliding_attention" in lt and raw.get("sliding_window_non_causal", True):
        raise ImportError_("sliding layers marked non-causal (sliding_window_non_causal true): flashdraft runs "
                           "sliding layers causally, as trained; retrain or set the field to false if they are causal")
    try:
        ids = CONVENTIONS["speculators"].from_file(raw["aux_hidden_state_layer_ids"])
    except KeyError:
        raise ImportError_("speculators config has no aux_hidden_state_layer_ids") from None
    except ConventionError as e:
        raise ImportError_(str(e)) from None
    inner = dict(layer.pop("dflash_config", None) or {})
    inner.update(mask_token_id=raw["mask_token_id"], target_layer_ids=ids)
    cfg = {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}}
    cfg.update(block_size=raw.get("block_size", 8), dflash_config=inner)
    cfg.update(layer)
    vocab = layer.get("vocab_size")
    dv = raw.get("draft_vocab_size")
    cfg["draft_vocab_size"] = dv if dv is not None and dv != vocab else None
    cfg["target_hidden_size"] = raw.get("target_hidden_size") or layer.get("hidden_size")
    if "torch_dtype" in raw:
        cfg["torch_dtype"] = raw["torch_dtype"]
    rope_theta(cfg)
    return cfg


class DFlashImporter(Importer):
    architecture = "dflash"
    config_class = DFlashConfig
    architectures = ("DFlashDraftModel",)
    speculators_type = "dflash"

    def weights(self, tensors, cfg, target, notes):
        out = {}
        for k, v in tensors.items():
            k = k.removeprefix("model.")
            if k in DERIVED:
                notes.append(f"dropped {k} (flashdraft borrows the target's embedding / head)")
                continue
            if k == "lm_head.weight" and cfg.draft_vocab_size is None:
                notes.append("dropped a full-vocabulary lm_head.weight (flashdraft borrows the target's LM head)")
                continue
            out[k] = v.contiguous()
        if cfg.draft_vocab_size == cfg.vocab_size and "d2t" not in out:  # an own head over every id, in target order
            out["d2t"] = torch.zeros(cfg.vocab_size, dtype=torch.long)
        if cfg.draft_vocab_size is not None and "t2d" not in out and "d2t" in out:
            out["t2d"] = t2d_from_d2t(out["d2t"], cfg.vocab_size)
        return out


@register_importer
class ZLabImporter(DFlashImporter):
    format = "zlab"

    def detects(self, raw):
        return "speculators_model_type" not in raw and "eagle_aux_hidden_state_layer_ids" not in raw

    def config(self, raw, target, mask_token_id, notes):
        _check_vllm_ids(raw)
        return zlab_config(raw, target, mask_token_id)


@register_importer
class SGLangImporter(ZLabImporter):
    format = "sglang"  # z-lab files (SGLang reads the z-lab ids)

    def detects(self, raw):
        return False


@register_importer
class VLLMImporter(ZLabImporter):
    format = "vllm"

    def detects(self, raw):
        return "speculators_model_type" not in raw and "eagle_aux_hidden_state_layer_ids" in raw


@register_importer
class SpeculatorsImporter(DFlashImporter):
    format = "speculators"

    def detects(self, raw):
        return "speculators_model_type" in raw

    def config(self, raw, target, mask_token_id, notes):
        return speculators_config(raw)


def import_drafter(src: str | Path, out: str | Path, fmt: str = "auto", target: Target | None = None,
                   mask_token_id: int | None = None, overwrite: bool = False) -> tuple[Path, str, list[str]]:
    """Convert the checkpoint folder ``src`` (``fmt``: auto, or a format registered for its family: zlab,
    vllm, sglang, speculators for DFlash; vllm, speculators for EAGLE-3) into a flashdraft drafter folder
    ``out``; with ``target``, the fit is checked. Returns (out, format, notes)."""
    src, out = Path(src), Path(out)
    check_publish_dir(out, lambda d: (d / "config.json").is_file() and (d / "model.safetensors").is_file(),
                      "a flashdraft drafter", overwrite, inputs=[src])
    raw, tensors = _read(src)
    importer = pick_importer(raw, fmt)
    notes: list[str] = []
    d = importer.config(raw, target, mask_token_id, notes)
    dtype = d.pop("torch_dtype", None)
    try:
        cfg = importer.config_class.model_validate(d)
    except ValidationError as e:
        family = importer.config_class.family_name
        raise ImportError_(validation_message(e, f"{src}/config.json does not describe a {family} drafter flashdraft "
                                                 "runs")) from None
    state = importer.weights(tensors, cfg, target, notes)
    dump = cfg.model_dump(mode="json")
    if dtype is not None:
        dump["torch_dtype"] = dtype
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        (tmp / "config.json").write_text(json.dumps(dump, indent=2) + "\n")
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        try:
            drafter = load_drafter(tmp)  # structure check: names and shapes match the config
            if target is not None:
                drafter.check_fits(target)
        except ValueError as e:
            raise ImportError_(f"{src} does not load as a flashdraft drafter: {str(e).replace(str(tmp), str(src))}") from None
        atomic_replace_dir(tmp, out, keep_foreign=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if (src / MANIFEST).is_file():
        notes.append(f"source was written by flashdraft export ({MANIFEST})")
    return out, importer.format, notes
