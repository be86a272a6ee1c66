"""The ``generate`` section: what to regenerate, with which target and backend, and where to write it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from flashdraft.config import Section


class GenerateConfig(Section):
    """Config of ``flashdraft generate``; every field is also a command-line flag of the same name."""

    # what
    sources: list[str] = Field(
        default_factory=list,
        description="prompt sources: a .jsonl/.json/.parquet file, a folder of them, a datasets.save_to_disk folder, "
        "or a built-in name (stdlib-code, stdlib-docs, humaneval); prefix NAME= to set the source name",
    )
    limit: int | None = Field(None, ge=1, description="at most this many samples per source")
    include_heldout: bool = Field(False, description="allow held-out benchmark sources (humaneval) as training prompts")
    max_turns: int | None = Field(None, ge=1, description="regenerate at most this many assistant turns per conversation")
    # who
    target: str = Field("gemma-3-270m", description="target: embedded name, HF folder/id or .gguf file")
    backend: Literal["vllm", "hf", "openai"] = "vllm"
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    # sampling
    temperature: float = Field(0.0, ge=0.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, description="-1 = off")
    max_tokens: int = Field(512, ge=1, description="max new tokens per assistant turn")
    stop: list[str] = Field(default_factory=list, description="extra stop strings")
    stop_token_ids: list[int] = Field(default_factory=list, description="extra stop token ids (EOS ids are always used)")
    seed: int = 0
    thinking: bool | None = Field(None, description="chat-template enable_thinking; None = template default")
    chat_template: Literal["auto", "never"] = Field(
        "auto", description="auto: use the tokenizer's chat template if it has one; never: plain continuation"
    )
    max_model_len: int | None = Field(None, ge=16, description="context window; default: the target config's")
    # output
    output: str = Field("generated", description="output folder (Parquet parts, manifest.json, errors.jsonl)")
    resume: bool = Field(False, description="skip ids already written to output (else a non-empty output is an error)")
    num_shards: int = Field(1, ge=1, description="split the prompts across this many machines")
    shard_index: int = Field(0, ge=0)
    flush_every: int = Field(512, ge=1, description="write a Parquet part at least every this many records (and "
                             "after every chunk)")
    flush_seconds: float = Field(300.0, gt=0, description="... or at least this often")
    chunk_size: int | None = Field(
        None, ge=1, description="prompts handed to the backend at once (per turn depth); records are written after "
        "each chunk, so a killed run loses at most the chunk in flight. Default: 1024, or batch_size for hf (one "
        "batch: a kill loses at most the batch in flight)",
    )
    estimate_prompts: int = Field(100_000, ge=1, description="the summary estimates the time for this many more prompts")
    progress: bool = True
    # backend settings
    data_parallel: int = Field(1, ge=1, description="engines (one per GPU, CUDA_VISIBLE_DEVICES per worker)")
    tensor_parallel: int = Field(1, ge=1, description="vllm: GPUs per engine (TP); default 1 = pure data parallel")
    max_num_seqs: int = Field(256, ge=1, description="vllm: sequences batched per step")
    max_num_batched_tokens: int | None = Field(None, ge=16, description="vllm: tokens per scheduler step")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    enforce_eager: bool = Field(False, description="vllm: skip torch.compile / CUDA graphs (faster start)")
    vllm_kwargs: dict = Field(default_factory=dict, description="vllm: extra vllm.LLM(...) arguments")
    batch_size: int = Field(16, ge=1, description="hf: prompts per generate() call (left padded)")
    device: str = Field("auto", description="hf: cpu, cuda, cuda:N or auto")
    servers: list[str] = Field(default_factory=list, description="openai: base URLs (http://host:port/v1), round-robin")
    api_model: str | None = Field(None, description="openai: served model name (default: the first one /models lists)")
    api_key: str = "EMPTY"
    concurrency: int = Field(64, ge=1, description="openai: requests in flight per server")
    request_timeout: float = Field(600.0, gt=0)
    max_retries: int = Field(5, ge=0)
    retry_backoff: float = Field(1.0, ge=0, description="openai: first retry delay in seconds (doubles each time)")

    @field_validator("sources")
    @classmethod
    def _sources(cls, v: list[str]) -> list[str]:
        return [s for s in v if s]

    @model_validator(mode="after")
    def _check(self) -> "GenerateConfig":
        if self.shard_index >= self.num_shards:
            raise ValueError(f"shard_index {self.shard_index} must be < num_shards {self.num_shards}")
        if self.backend == "openai" and not self.servers:
            raise ValueError("backend openai needs at least one server URL (--server http://127.0.0.1:8000/v1)")
        return self

    @property
    def backend_chunk_size(self) -> int:
        """``chunk_size``, or its default for the backend (follows ``batch_size`` for hf)."""
        return self.chunk_size or (self.batch_size if self.backend == "hf" else 1024)
