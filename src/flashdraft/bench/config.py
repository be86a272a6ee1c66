"""The ``bench`` config sections: one typed schema per benchmark (YAML via --config, --set key=value, flags)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from flashdraft.config import Section
from flashdraft.decode.sizing import Sizing
from flashdraft.models.chat import ChatSettings, ChatTemplateMode
from flashdraft.models.target import EMBEDDED_TARGET


class BenchDecodeConfig(Section):
    """``flashdraft bench decode``: AR vs every registered drafter method on prompt sets."""

    target: str = EMBEDDED_TARGET
    drafter: list[str] = Field(default_factory=list, description="drafter folders (none: AR vs prompt lookup)")
    prompts: list[str] = Field(default_factory=lambda: ["humaneval"], description="named sets, 'humaneval' or JSONL "
                               "files with 'prompt' and/or 'messages'")
    chat_template: ChatTemplateMode = Field("auto", description="auto: prompts through the target's chat template when "
                                            "it has one (as a served user's); never: raw text")
    thinking: bool | None = Field(None, description="the chat template's enable_thinking switch; None = its default")
    system: str | None = Field(None, description="a system message before every prompt (chat template only)")
    limit: int = Field(4, ge=1, description="prompts per set")
    budgets: list[int] = Field(default_factory=lambda: [4, 8, 16, 32, 64, 128], description="DDTree budgets")
    temperatures: list[float] = Field(default_factory=lambda: [0.0])
    max_new_tokens: int = Field(32, ge=1)
    repeats: int = Field(3, ge=1, description="runs per prompt and variant (median)")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    threads: int = Field(1, ge=1, description="torch intra-op threads")
    device: str = Field("cpu", description="where the target and drafters run: cpu, cuda or cuda:N")
    ngram: bool = Field(True, description="also run prompt lookup (ngram, ngram_tree@b)")
    lookup_min: int = Field(1, ge=1, description="prompt lookup: shortest n-gram matched (vLLM's prompt_lookup_min)")
    lookup_max: int = Field(3, ge=1, description="prompt lookup: longest n-gram matched (vLLM's prompt_lookup_max)")
    sizing: list[Sizing] = Field(
        default_factory=lambda: ["fixed"], description="DDTree sizings to run: fixed (the whole budget), cost (what pays "
        "on this machine, rows @b+cost); several give one row each")
    hints: list[Literal["lookup", "none"]] | None = Field(
        None, description="DFlash drafters' block hints to run: lookup, none (MASK, what other engines fill); several "
        "give each drafter one set of rows per mode (<drafter>+hints=none/...); default: each drafter's own")
    rows: list[str] | None = Field(None, description="run only the rows whose names match these shell patterns "
                                   "(e.g. ngram, */dflash, */ddtree@32+cost); AR always runs")
    out: str = "runs/bench_decode"

    @property
    def chat(self) -> ChatSettings:
        return ChatSettings(self.chat_template, self.thinking, self.system)


class BenchServeConfig(Section):
    """``flashdraft bench serve``: a concurrency sweep against OpenAI-compatible servers."""

    baseline_url: str | None = Field(None, description="base URL of the plain server (.../v1); required")
    speculative_url: str | None = None
    prompts: str = "humaneval"
    num_prompts: int = Field(32, ge=1)
    max_tokens: int = Field(128, ge=1)
    concurrency: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    ignore_eos: bool = True
    target: str = Field("TARGET", description="only for the printed vLLM commands")
    drafter: str | None = Field(None, description="only for the printed vLLM commands")
    block_size: int = Field(16, ge=2, description="drafter block size B (num_speculative_tokens = B-1)")
    timeout_s: float = Field(300.0, gt=0)
    out: str = "runs/bench_serve"


class BenchModelConfig(Section):
    """``flashdraft bench model``: the cost model (input file, preset or profile) and its validation."""

    input: str | None = None
    preset: str | None = None
    profile: bool = False
    target: str = EMBEDDED_TARGET
    drafter: str | None = None
    decode_results: str | None = None
    tp: int | None = Field(None, ge=1, description="GPUs per tensor-parallel group")
    gpus: int | None = Field(None, ge=1)
    interconnect: str | None = Field(None, description="pcie | nvlink | none")
    latency_us: float | None = None
    bandwidth_gbps: float | None = None
    concurrency: list[int] | None = None
    budgets: list[int] | None = None
    profile_sizes: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 129])
    profile_repeats: int = Field(5, ge=1)
    threads: int = Field(1, ge=1)
    out: str = "runs/bench_model"
