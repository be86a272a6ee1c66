"""The ``train`` config section: one typed schema for the YAML, the flags and the saved checkpoints."""

from __future__ import annotations

import sys
from typing import Literal

from pydantic import Field, field_validator, model_validator

from flashdraft.config import Section


class TrainConfig(Section):
    """Everything ``flashdraft train`` reads. Field names are the YAML keys and the flag names."""

    # what to train
    target: str = "gemma-3-270m"
    data: list[str] = Field(default_factory=list, description="JSONL/JSON/Parquet record files")
    out_dir: str = "runs/dflash"
    device: str = Field("auto", description="auto: this rank's GPU (LOCAL_RANK) if CUDA is there, else cpu")
    target_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    objective: str = Field("dflash", description="training objective (and drafter family) from the objective registry")
    init_from: str | None = Field(None, description=(
        "start from this drafter folder instead of a fresh one; a DFlash drafter with fewer layers than "
        "num_layers grows to num_layers, the added layers starting as identity, and trains at block_size when "
        "the config sets it (else at its own)"))
    num_layers: int = Field(1, ge=1)
    block_size: int = Field(16, ge=2, description="DFlash block size B (B-1 drafted tokens a round)")
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = None
    intermediate_size: int | None = None
    init_norm_from_target: bool = Field(True, description="fresh drafters: final norm starts at the target's scale")
    draft_vocab_size: int | Literal["auto"] | None = Field(
        None, description="reduced draft vocabulary: the N most frequent supervised tokens of the data (d2t/t2d); "
        "auto: the target's whole vocabulary where its LM head is cheap next to a verify round, else the largest "
        "of 8k/16k/32k/64k that is (flashdraft.models.draft_vocab.auto_draft_vocab_size)")
    draft_vocab_reserve: float = Field(0.0, ge=0, le=1, description=(
        "share of the draft vocabulary split evenly over the data's domains (and the corpus's), each share filled "
        "with that domain's own most frequent tokens first, so a minority domain is not crowded out"))
    draft_vocab_corpus: list[str] = Field(default_factory=list, description=(
        "record files (their domain_field names each text's domain) or .txt files whose tokens also count "
        "towards the draft vocabulary"))
    domain_field: str = Field("domain", description=(
        "the records' domain field (`flashdraft mix rebalance` writes it); a record without it is labelled by "
        "`flashdraft mix`'s classifier when the draft vocabulary's coverage is reported per domain"))
    features: str | None = Field(None, description="offline feature cache from `flashdraft features` (else online)")
    feature_norm: Literal["none", "layer", "channel"] = Field(
        "channel", description="fc input scale from feature statistics (folded into fc.weight on save): channel = "
        "every channel at unit RMS (tames massive activations), layer = each target layer at unit RMS, none",
    )
    stats_sequences: int = Field(16, ge=1, description="training sequences sampled for the feature statistics")

    # objective
    max_len: int = Field(1024, ge=2)
    max_anchors: int = Field(64, ge=1)
    gamma: float | None = Field(None, gt=0, description="decay exp(-(k-1)/gamma); default 7 for B=16, 4 for B=8")
    position_weights: Literal["decay", "dpace", "first_error", "tree"] = Field(
        "decay", description="slot weights: decay exp(-(k-1)/gamma); dpace (expected accepted length of the chain); "
        "first_error (focal weight on the slot that ends the accepted prefix); tree (expected accepted length of a "
        "tree keeping tree_width candidates per depth)",
    )
    dpace_alpha: float = Field(0.5, ge=0, le=1, description="smoothing of the drafter's own q for dpace/first_error/tree: q' = (1 - alpha) q + alpha")
    focal: float = Field(1.0, ge=0, description="first_error: weight (1 - q_k) ** focal on the slot that can break the chain")
    block_hints: Literal["lookup", "none"] | None = Field(
        None, description="dflash: 'lookup' fills a hint_prob share of the training blocks' draft slots with prompt "
        "lookup's chain (MASK where nothing matches) instead of MASK and saves block_hints in config.json, so "
        "flashdraft's dflash/ddtree decoders fill them in (other engines fill MASK, which the drafter still learns); "
        "'none': MASK only; unset: as the init_from drafter has it (a fresh one: none)")
    hint_prob: float = Field(0.5, ge=0, le=1, description="block_hints: the share of training blocks that get hints")
    loss_normaliser: Literal["weights", "anchors", "slots"] | None = Field(
        None, description="what a step's weighted loss sum is divided by: weights (their sum; decay's default), "
        "anchors (with a supervised slot 1; dpace, first_error and tree's default) or slots (the supervised slots, "
        "as speculators' DFlash loss divides)")
    tree_width: int = Field(4, ge=1, description="tree: candidates per depth the surrogate assumes (about budget / depth)")
    loss: Literal["ce", "kl"] = "ce"
    feature_noise: float = Field(0.0, ge=0, description="uniform +-noise on the fc input only")
    lm_head_chunk: int = Field(128, ge=1, description="rows per checkpointed LM-head + loss chunk")
    checkpoint_layers: bool = False
    attention: Literal["auto", "sdpa", "flex"] = Field(
        "auto", description="drafter training attention: flex on CUDA, SDPA + dense mask on CPU (auto)"
    )
    loss_vocab: int | None = Field(
        None, ge=1, description="CE over the batch's labels + this many uniform negatives (sampled softmax); None = full"
    )
    checkpoint_lm_head: bool = Field(True, description="recompute LM-head chunks in backward (bounded memory)")
    ttt_steps: int = Field(7, ge=1, description="eagle3: training-time-test steps unrolled (= the drafter's max_depth)")
    ttt_decay: float = Field(0.8, gt=0, le=1, description="eagle3: weight ttt_decay ** k of unrolled step k")
    conv_kernel_size: int = Field(2, ge=1, description="dflash2: causal taps of each local convolution in the block")
    conv_group_size: int = Field(16, ge=1, description="dflash2: channels sharing one token-dependent kernel delta")
    selector_rank: int = Field(256, ge=1, description="dflash2: width of the candidate selector's codebooks")
    selector_top_k: int = Field(16, ge=1, description="dflash2: unary candidates the selector rescores per slot")
    selector_loss_alpha: float = Field(1.0, ge=0, description="dflash2: weight of the selector loss beside the unary one")
    full_vocab_argmax: bool = Field(
        True, description="eagle3: drop slots whose target argmax (full vocabulary) lies outside the draft vocabulary; "
        "false: check the data token only (the same rule on the target's own greedy data; LM head over draft rows only)")
    append_eos: bool = True

    # optimisation
    batch_size: int = Field(1, ge=1)
    grad_accum: int = Field(1, ge=1)
    pack: bool = False
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1, description="optimizer steps; overrides epochs")
    max_minutes: float | None = Field(None, gt=0, description="stop (with a checkpoint) after this wall time")
    optimizer: Literal["adamw", "muon"] = Field("adamw", description=(
        "adamw; muon: torch.optim.Muon on the hidden 2-D weight matrices (momentum 0.95, weight decay 0.1, its update "
        "scaled to AdamW's RMS, as speculators trains) and AdamW on the rest, at one learning rate"))
    lr: float = Field(6e-4, gt=0)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    warmup_ratio: float = Field(0.04, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = Field(1.0, ge=0)
    bf16: bool = Field(False, description="bf16 autocast for the drafter forward (weights stay fp32)")
    ema_decay: float | None = Field(None, gt=0, lt=1, description="EMA of the weights (evaluated and exported)")
    seed: int = 0
    threads: int | None = Field(None, ge=1)
    target_ranks: int = Field(
        0, ge=0, description="disaggregated: ranks 0..N-1 only run the target and stream features to the other "
        "ranks, which train (0 = every rank runs its own target pass); see flashdraft.train.disaggregated",
    )

    # bookkeeping
    save_every: int = Field(100, ge=1)
    keep_last: int = Field(3, ge=1)
    log_every: int = Field(1, ge=1)
    eval_every: int = Field(0, ge=0, description="0 = only at the end")
    eval_prompts: str | None = Field(None, description="JSONL of {prompt} or {prompt_ids} for real decoding tau")
    eval_n: int = Field(8, ge=0)
    eval_max_new_tokens: int = Field(48, ge=1)
    holdout: float = Field(
        0.0, ge=0, lt=1, description="share of the training sequences held out (never trained on) for held-out "
        "per-slot accuracy, the context ablation and the n-gram baselines (at eval_every steps and at the end)",
    )
    holdout_max: int = Field(64, ge=1, description="at most this many held-out sequences are scored")
    holdout_walk: int = Field(
        16, ge=0, description="on this many held-out sequences, draft at every anchor and walk them as a greedy "
        "decoder does (rounds start after each miss): 'walk tau', what real decoding measures; 0 = off",
    )
    calibrate_tree: bool = Field(
        True, description="at the end, set a block drafter's tree_temperature (config.json) to where DDTree's tree "
        "estimates its own acceptance right on the holdout_walk sequences (cost sizing trusts those estimates)",
    )
    train_sequences: int | None = Field(
        None, ge=1, description="train on this many of the sequences left after the hold-out (a seeded draw; "
        "the held-out set and a feature cache stay the same), for a learning curve over data size",
    )
    progress: bool = True
    tensorboard: bool = True
    resume: bool = True

    # several drafters from one target pass: [{name: b8, block_size: 8}, {name: b16, block_size: 16}]
    variants: list[dict] = Field(default_factory=list, description="per-variant overrides of VARIANT_FIELDS")

    @field_validator("objective")
    @classmethod
    def _known_objective(cls, name: str) -> str:
        from flashdraft.train.objectives import OBJECTIVES, objective_names

        if name not in objective_names():
            raise ValueError(f"unknown objective {name!r}; choose one of: {', '.join(sorted(OBJECTIVES))}")
        return name

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.max_len < self.block_size:
            raise ValueError(f"max_len {self.max_len} is shorter than one block ({self.block_size}); raise max_len")
        if self.block_hints == "lookup" and self.objective not in ("dflash", "dflash2"):
            raise ValueError(f"block_hints 'lookup' fills a DFlash block's draft slots; objective {self.objective!r} "
                             "drafts token by token: drop block_hints or use objective dflash")
        if self.target_ranks and self.features:
            raise ValueError(
                f"target_ranks {self.target_ranks} with features {self.features}: the offline cache needs no target "
                "ranks; set target_ranks: 0 or drop features"
            )
        names = []
        for v in self.variants:
            bad = sorted(set(v) - set(VARIANT_FIELDS) - {"name"})
            if bad or not isinstance(v.get("name"), str) or not v["name"].strip():
                raise ValueError(
                    f"variant {v}: each variant needs a 'name' and may set only {', '.join(VARIANT_FIELDS)}"
                    + (f" (not {', '.join(bad)}: those are shared by all variants)" if bad else "")
                )
            names.append(v["name"])
        if len(set(names)) != len(names):
            raise ValueError(f"variant names must differ, got {names}")
        return self

    @field_validator("draft_vocab_size")
    @classmethod
    def _positive_vocab(cls, size):
        if isinstance(size, int) and size < 1:
            raise ValueError(f"draft_vocab_size {size} must be >= 1, 'auto' or unset (the target's vocabulary)")
        return size

    def resolved_draft_vocab_size(self, target, block_size: int | None = None) -> int | None:
        """draft_vocab_size with ``auto`` resolved for ``target`` (and a drafter of ``block_size``, default this
        config's), printed where it was auto."""
        if self.draft_vocab_size != "auto":
            return self.draft_vocab_size
        from flashdraft.models.draft_vocab import auto_draft_vocab_size, head_share

        B = block_size or self.block_size
        size = auto_draft_vocab_size(target, B)
        share = head_share(target, size or target.vocab_size, B)
        print(f"draft_vocab_size auto: {size or 'the whole vocabulary'} ({target.vocab_size:,} ids in the target; the "
              f"drafter's head costs {share:.1%} of a verify round of {B} tokens)", file=sys.stderr)
        return size

    def draft_vocab(self, examples, target, size: int):
        """The ``size`` draft ids this config draws from ``examples`` (reserve and corpus applied) -> [size]."""
        from flashdraft.train.data import draft_vocab_for

        return draft_vocab_for(examples, target, size, self.draft_vocab_reserve, self.draft_vocab_corpus,
                               self.domain_field)

    def variant_configs(self) -> list[tuple[str | None, "TrainConfig"]]:
        """(name, config) per variant; one unnamed variant (this config) when ``variants`` is empty."""
        if not self.variants:
            return [(None, self)]
        out = []
        for v in self.variants:
            over = {k: val for k, val in v.items() if k != "name"}
            out.append((v["name"], TrainConfig.model_validate({**self.model_dump(exclude_unset=True), **over, "variants": []})))
        return out


# fields a variant may change; everything else (data, target, batch, schedule length, cadence) is shared
VARIANT_FIELDS = (
    "objective", "init_from", "num_layers", "block_size", "target_layer_ids", "mask_token_id", "intermediate_size",
    "init_norm_from_target", "draft_vocab_size", "draft_vocab_reserve", "draft_vocab_corpus", "feature_norm", "max_anchors", "gamma", "position_weights", "dpace_alpha", "focal", "tree_width", "loss_normaliser", "block_hints", "hint_prob", "loss",
    "feature_noise", "loss_vocab", "ttt_steps", "ttt_decay", "full_vocab_argmax", "optimizer", "conv_kernel_size", "conv_group_size", "selector_rank",
    "selector_top_k", "selector_loss_alpha", "lr", "min_lr_ratio", "warmup_ratio", "weight_decay", "betas", "grad_clip",
    "ema_decay",
)
