"""``config.json`` of an EAGLE-3 drafter: the Llama fields vLLM's ``llama_eagle3.py`` reads, plus
flashdraft's own layer ids.

Layer ids. ``eagle3_config.target_layer_ids`` holds flashdraft ids (decoder layer ``i``'s output =
HF ``hidden_states[i + 1]``, see :mod:`flashdraft.export.conventions`); ``eagle_config.
eagle_aux_hidden_state_layer_ids`` holds the same layers in vLLM's convention (the residual stream
entering layer ``j = i + 1``). Both are written, and a file whose two fields disagree is refused.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

VLLM_AUX_OFFSET = 1  # vLLM aux id = flashdraft id + 1 (the input of the next layer is the output of this one)


class Eagle3Inner(BaseModel):
    model_config = ConfigDict(extra="allow")
    target_layer_ids: list[int]
    max_depth: int = Field(7, ge=1)  # chain steps one propose() drafts (the training-time-test depth)


class Eagle3Config(BaseModel):
    """``config.json`` of an EAGLE-3 drafter (unknown fields are kept on save)."""

    model_config = ConfigDict(extra="allow")

    architectures: list[str] = ["LlamaForCausalLMEagle3"]
    model_type: str = "llama"
    eagle3_config: Eagle3Inner
    eagle_config: dict = {}
    num_target_layers: int
    target_hidden_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int = 1
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    rope_scaling: None = None
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    mlp_bias: bool = False
    vocab_size: int
    draft_vocab_size: int
    tie_word_embeddings: bool = False

    @model_validator(mode="after")
    def _check(self) -> "Eagle3Config":
        if self.num_hidden_layers != 1:
            raise ValueError(f"num_hidden_layers {self.num_hidden_layers}: an EAGLE-3 drafter has exactly one decoder layer")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; EAGLE-3 drafters use silu")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} must be in 1..vocab_size {self.vocab_size}")
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
