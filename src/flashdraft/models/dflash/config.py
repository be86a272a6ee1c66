"""``config.json`` of a DFlash drafter (z-lab format)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from flashdraft.models.drafter import DrafterConfig

LayerType = Literal["full_attention", "sliding_attention"]


class DFlashInner(BaseModel):
    model_config = ConfigDict(extra="allow")
    mask_token_id: int
    target_layer_ids: list[int]


class DFlashConfig(DrafterConfig):
    """``config.json`` of a DFlash drafter (z-lab format; unknown fields are kept on save)."""

    family_name: ClassVar[str] = "DFlash"

    architectures: list[str] = ["DFlashDraftModel"]
    auto_map: dict[str, str] = {"AutoModel": "dflash.DFlashDraftModel"}
    model_type: str = "qwen3"
    block_size: int = Field(16, ge=2)
    dflash_config: DFlashInner
    num_hidden_layers: int = Field(ge=1)
    rope_theta: float = 1_000_000.0
    layer_types: list[LayerType] = []
    sliding_window: int | None = None
    draft_vocab_size: int | None = None
    tree_temperature: float | None = Field(None, gt=0, description=(
        "softmax temperature of the marginals DDTree builds its tree from (flashdraft; other loaders ignore it): "
        "the one at which the tree's own estimate of its accepted drafts matches a held-out walk's, so cost "
        "sizing trusts calibrated probabilities; None = 1"))
    block_hints: Literal["lookup"] | None = Field(None, description=(
        "what fills the block's draft slots at flashdraft's decoding (other loaders ignore it and fill MASK): "
        "'lookup' = the tokens prompt lookup copies from the context (MASK where nothing matches), which the "
        "drafter was trained to confirm or correct; None = MASK"))

    @model_validator(mode="after")
    def _check(self) -> "DFlashConfig":
        if not self.layer_types:
            self.layer_types = ["full_attention"] * self.num_hidden_layers
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")
        self.check_layer_shape()
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        out = handler(self)
        for key in ("tree_temperature", "block_hints"):  # unset: a file keeps the z-lab fields only
            if out.get(key, 0) is None:
                del out[key]
        return out

    @property
    def mask_token_id(self) -> int:
        return self.dflash_config.mask_token_id

    @property
    def target_layer_ids(self) -> list[int]:
        return self.dflash_config.target_layer_ids
