"""The DFlash2 family's export and import: vllm-project/speculators' ``dflash2`` layout (``DFlash2DraftModel``).

It is the speculators DFlash layout (:class:`~flashdraft.export.formats.SpeculatorsExporter`) with the
architecture and algorithm named ``dflash2`` and the four fields of the convolutions and the selector at the top
of ``config.json``; the tensors keep flashdraft's names, which are speculators'. speculators 0.9 builds a DFlash2
drafter over the verifier's whole vocabulary only, so a drafter with a draft vocabulary is refused. vLLM 0.32
reads the same files (its ``dflash2`` speculators config, ``DFlash2DraftModel``) but drafts with the candidate
selector only in its Model Runner V2, which needs Triton (GPUs); its CPU build refuses such drafts.
"""

from __future__ import annotations

from pathlib import Path

from flashdraft.export.formats import ARCHITECTURES, ExportError, SpeculatorsExporter, register_exporter
from flashdraft.export.importers import SpeculatorsImporter, register_importer, speculators_config
from flashdraft.models.dflash.dflash2 import DFlash2Config, DFlash2Drafter

ARCHITECTURES["DFlash2DraftModel"] = "dflash2"
DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


@register_exporter
class DFlash2SpeculatorsExporter(SpeculatorsExporter):
    architecture = "dflash2"
    description = "vllm-project/speculators dflash2 (the speculators DFlash layout + convolutions and selector)"

    def read_config(self, path: Path) -> DFlash2Config:
        return DFlash2Drafter.load_config(path)

    def build(self, src, quirks, target, target_ref):
        c = src.config
        if c.draft_vocab_size is not None:
            raise ExportError(f"drafter {src.path} drafts from {c.draft_vocab_size} ids; speculators builds a DFlash2 "
                              "drafter over the verifier's whole vocabulary only. Train it without draft_vocab_size")
        files = super().build(src, quirks, target, target_ref)
        cfg = files.config
        cfg["architectures"] = ["DFlash2DraftModel"]
        cfg["speculators_model_type"] = "dflash2"
        cfg["speculators_config"]["algorithm"] = "dflash2"
        cfg.update({k: getattr(c, k) for k in DFLASH2_FIELDS})
        for k in DFLASH2_FIELDS:  # the z-lab fields speculators keeps at the top, not in the layer config
            cfg["transformer_layer_config"].pop(k, None)
        return files


@register_importer
class DFlash2SpeculatorsImporter(SpeculatorsImporter):
    architecture = "dflash2"
    config_class = DFlash2Config
    architectures = ("DFlash2DraftModel",)
    speculators_type = "dflash2"

    def detects(self, raw):
        return raw.get("speculators_model_type") == "dflash2"

    def config(self, raw, target, mask_token_id, notes):
        cfg = speculators_config(raw)
        cfg["architectures"] = ["DFlash2DraftModel"]
        cfg.update({k: raw[k] for k in DFLASH2_FIELDS if k in raw})
        return cfg
