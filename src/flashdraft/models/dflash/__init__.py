"""The DFlash block-diffusion drafter family: config (``config.json``), layers, the drafter with its
inference step and training forward (model), and the training visibility masks (masks).
Importing the package registers the family under its architecture name ``DFlashDraftModel``."""

from flashdraft.models.dflash.config import DFlashConfig, DFlashInner
from flashdraft.models.dflash.layers import attend, rope_cos_sin
from flashdraft.models.dflash.model import DFlashDrafter
from flashdraft.models.drafter import DrafterError

__all__ = ["DFlashConfig", "DFlashDrafter", "DFlashInner", "DrafterError", "attend", "rope_cos_sin"]
