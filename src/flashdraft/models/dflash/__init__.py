"""The DFlash block-diffusion drafter family: config (``config.json``), layers, the drafter with its
inference step and training forward (model), and the training visibility masks (masks).
Importing the package registers the family under its architecture name ``DFlashDraftModel``, and DFlash2 (local
convolutions and a candidate selector, :mod:`flashdraft.models.dflash.dflash2`) under ``DFlash2DraftModel``."""

from flashdraft.models.dflash.config import DFlashConfig, DFlashInner
from flashdraft.models.dflash.layers import attend, rope_cos_sin
from flashdraft.models.dflash.model import DFlashDrafter
from flashdraft.models.dflash.dflash2 import DFlash2Config, DFlash2Drafter  # noqa: E402  (after DFlashDrafter)
from flashdraft.models.drafter import DrafterError

__all__ = ["DFlash2Config", "DFlash2Drafter", "DFlashConfig", "DFlashDrafter", "DFlashInner", "DrafterError", "attend", "rope_cos_sin"]
