"""The ``train`` config section: one typed schema for the YAML, the flags and the saved checkpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from flashdraft.config import Section


class TrainConfig(Section):
    """Everything ``flashdraft train`` reads. Field names are the YAML keys and the flag names."""

    # what to train
    target: str = "gemma-3-270m"
    data: list[str] = Field(default_factory=list, description="JSONL/JSON/Parquet record files")
    out_dir: str = "runs/dflash"
    init_from: str | None = Field(None, description="start from this drafter folder instead of a fresh one")
    num_layers: int = Field(1, ge=1)
    block_size: int = Field(16, ge=2)
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = None
    intermediate_size: int | None = None
    init_norm_from_target: bool = Field(True, description="fresh drafters: final norm starts at the target's scale")

    # objective
    max_len: int = Field(1024, ge=2)
    max_anchors: int = Field(64, ge=1)
    gamma: float | None = Field(None, gt=0, description="decay exp(-(k-1)/gamma); default 7 for B=16, 4 for B=8")
    loss: Literal["ce", "kl"] = "ce"
    feature_noise: float = Field(0.0, ge=0, description="uniform +-noise on the fc input only")
    lm_head_chunk: int = Field(128, ge=1, description="rows per checkpointed LM-head + loss chunk")
    checkpoint_layers: bool = False
    loss_vocab: int | None = Field(
        None, ge=1, description="CE over the batch's labels + this many uniform negatives (sampled softmax); None = full"
    )
    checkpoint_lm_head: bool = Field(True, description="recompute LM-head chunks in backward (bounded memory)")
    append_eos: bool = True

    # optimisation
    batch_size: int = Field(1, ge=1)
    grad_accum: int = Field(1, ge=1)
    pack: bool = False
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1, description="optimizer steps; overrides epochs")
    max_minutes: float | None = Field(None, gt=0, description="stop (with a checkpoint) after this wall time")
    lr: float = Field(6e-4, gt=0)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    warmup_ratio: float = Field(0.04, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = Field(1.0, ge=0)
    bf16: bool = Field(False, description="bf16 autocast for the drafter forward (weights stay fp32)")
    seed: int = 0
    threads: int | None = Field(None, ge=1)

    # bookkeeping
    save_every: int = Field(100, ge=1)
    keep_last: int = Field(3, ge=1)
    log_every: int = Field(1, ge=1)
    eval_every: int = Field(0, ge=0, description="0 = only at the end")
    eval_prompts: str | None = Field(None, description="JSONL of {prompt} or {prompt_ids} for real decoding tau")
    eval_n: int = Field(8, ge=0)
    eval_max_new_tokens: int = Field(48, ge=1)
    progress: bool = True
    resume: bool = True

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.max_len < self.block_size:
            raise ValueError(f"max_len {self.max_len} is shorter than one block ({self.block_size}); raise max_len")
        return self
