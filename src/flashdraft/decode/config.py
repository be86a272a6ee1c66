"""The ``decode`` section of the config schema: what to decode and how."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from flashdraft.config import Section
from flashdraft.decode.sizing import Sizing
from flashdraft.models.chat import ChatSettings, ChatTemplateMode
from flashdraft.models.target import EMBEDDED_TARGET


class DecodeConfig(Section):
    target: str = EMBEDDED_TARGET
    drafter: str | None = None
    method: str = Field("ar", description="a registered decoding method (flashdraft.decode.DECODERS)")
    budget: int | None = Field(None, ge=1, description="drafted nodes per round: DDTree/ngram_tree (default 32), eagle3_tree (default 60), ngram/eagle3 chain (default 7)")
    lookup_min: int = Field(1, ge=1, description="ngram*: shortest n-gram matched (vLLM's prompt_lookup_min)")
    lookup_max: int = Field(3, ge=1, description="ngram*: longest n-gram matched (vLLM's prompt_lookup_max)")
    sizing: Sizing = Field(
        "fixed", description="ddtree*: fixed verifies the whole budget; cost keeps what pays for its verify cost on this "
        "machine (flashdraft.decode.sizing)")
    tree_temperature: float | None = Field(
        None, gt=0, description="ddtree*: softmax temperature of the marginals the tree is built from (default: the "
        "drafter's calibrated tree_temperature, else 1)")
    hints: Literal["lookup", "none"] | None = Field(
        None, description="dflash/ddtree*: what fills the drafter's draft slots: lookup (prompt lookup's chain) or none "
        "(MASK); default: the drafter's block_hints (config.json), else none")
    chat_template: ChatTemplateMode = Field(
        "auto", description="auto: the prompt goes through the target's chat template when it has one (as a served "
        "user's does); never: the raw text is continued")
    thinking: bool | None = Field(None, description="the chat template's enable_thinking switch; None = its default")
    system: str | None = Field(None, description="a system message before the prompt (chat template only)")
    temperature: float = Field(0.0, ge=0.0)
    max_new_tokens: int = Field(64, ge=1)
    seed: int = 0
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"

    @property
    def chat(self) -> ChatSettings:
        return ChatSettings(self.chat_template, self.thinking, self.system)

    @field_validator("method")
    @classmethod
    def _registered(cls, method: str) -> str:
        from flashdraft.decode import DECODERS

        if method not in DECODERS:
            raise ValueError(f"unknown decoding method {method!r}; choose one of: {', '.join(sorted(DECODERS))}")
        return method
