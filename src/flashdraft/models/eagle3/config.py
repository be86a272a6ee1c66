"""``config.json`` of an EAGLE-3 drafter: the Llama fields vLLM's ``llama_eagle3.py`` reads, plus
flashdraft's own layer ids.

Layer ids. ``eagle3_config.target_layer_ids`` holds flashdraft ids (decoder layer ``i``'s output =
HF ``hidden_states[i + 1]``, see :mod:`flashdraft.export.conventions`); ``eagle_config.
eagle_aux_hidden_state_layer_ids`` holds the same layers in vLLM's convention (the residual stream
entering layer ``j = i + 1``). Both are written, and a file whose two fields disagree is refused.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flashdraft.models.drafter import DrafterConfig

VLLM_AUX_OFFSET = 1  # vLLM aux id = flashdraft id + 1 (the input of the next layer is the output of this one)


class Eagle3Inner(BaseModel):
    model_config = ConfigDict(extra="allow")
    target_layer_ids: list[int]
    max_depth: int = Field(7, ge=1)  # chain steps one propose() drafts (the training-time-test depth)


class Eagle3Config(DrafterConfig):
    """``config.json`` of an EAGLE-3 drafter (unknown fields are kept on save)."""

    family_name: ClassVar[str] = "EAGLE-3"

    architectures: list[str] = ["LlamaForCausalLMEagle3"]
    model_type: str = "llama"
    eagle3_config: Eagle3Inner
    eagle_config: dict = {}
    num_hidden_layers: int = 1
    rope_theta: float = 10_000.0
    mlp_bias: bool = False
    draft_vocab_size: int

    @model_validator(mode="after")
    def _check(self) -> "Eagle3Config":
        if self.num_hidden_layers != 1:
            raise ValueError(f"num_hidden_layers {self.num_hidden_layers}: an EAGLE-3 drafter has exactly one decoder layer")
        self.check_layer_shape()
        aux = [i + VLLM_AUX_OFFSET for i in self.target_layer_ids]
        written = self.eagle_config.get("eagle_aux_hidden_state_layer_ids")
        if written is not None and list(written) != aux:
            raise ValueError(
                f"eagle_config.eagle_aux_hidden_state_layer_ids {list(written)} do not match eagle3_config.target_layer_ids "
                f"{self.target_layer_ids} (vLLM ids are flashdraft ids + {VLLM_AUX_OFFSET}: expected {aux}); fix one of them"
            )
        self.eagle_config = {**self.eagle_config, "eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True}
        return self

    @property
    def target_layer_ids(self) -> list[int]:
        return self.eagle3_config.target_layer_ids

    @property
    def max_depth(self) -> int:
        return self.eagle3_config.max_depth
