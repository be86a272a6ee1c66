"""``config.json`` of a DFlash drafter (z-lab format)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

LayerType = Literal["full_attention", "sliding_attention"]


class DFlashInner(BaseModel):
    model_config = ConfigDict(extra="allow")
    mask_token_id: int
    target_layer_ids: list[int]


class DFlashConfig(BaseModel):
    """``config.json`` of a DFlash drafter (z-lab format; unknown fields are kept on save)."""

    model_config = ConfigDict(extra="allow")

    architectures: list[str] = ["DFlashDraftModel"]
    auto_map: dict[str, str] = {"AutoModel": "dflash.DFlashDraftModel"}
    model_type: str = "qwen3"
    block_size: int = Field(16, ge=2)
    dflash_config: DFlashInner
    num_target_layers: int
    target_hidden_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int = Field(ge=1)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: None = None
    max_position_embeddings: int = 32768
    layer_types: list[LayerType] = []
    sliding_window: int | None = None
    attention_bias: bool = False
    vocab_size: int
    draft_vocab_size: int | None = None
    tie_word_embeddings: bool = False

    @model_validator(mode="after")
    def _check(self) -> "DFlashConfig":
        if not self.layer_types:
            self.layer_types = ["full_attention"] * self.num_hidden_layers
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; DFlash drafters use silu")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.draft_vocab_size is not None and not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} must be in 1..vocab_size {self.vocab_size}")
        return self

    @property
    def mask_token_id(self) -> int:
        return self.dflash_config.mask_token_id

    @property
    def target_layer_ids(self) -> list[int]:
        return self.dflash_config.target_layer_ids
