"""``flashdraft generate``: regenerate training conversations with the target itself.

Sources (files, ``datasets`` folders, built-in offline sets) -> turn-by-turn regeneration through a
backend (vllm, hf, openai) -> sharded Parquet records with ``token_ids`` and ``loss_mask``, resumable.
"""

from flashdraft.generate.config import GenerateConfig

__all__ = ["GenerateConfig"]
