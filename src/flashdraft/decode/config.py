"""The ``run`` section of the config schema: what to decode and how."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from flashdraft.config import Section
from flashdraft.models.target import EMBEDDED_TARGET


class DecodeConfig(Section):
    target: str = EMBEDDED_TARGET
    drafter: str | None = None
    method: Literal["ar", "dflash", "ddtree", "ngram", "ngram_tree", "ddtree_ngram"] = "ar"
    budget: int | None = Field(None, ge=1, description="drafted nodes per round: DDTree/ngram_tree (default 32), ngram chain (default 7)")
    temperature: float = Field(0.0, ge=0.0)
    max_new_tokens: int = Field(64, ge=1)
    seed: int = 0
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
