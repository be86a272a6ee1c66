"""Typer command ``flashdraft generate`` (registered by flashdraft.cli); also runnable as a module."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from flashdraft.config import ConfigError
from flashdraft.errors import exit_on_error
from flashdraft.models.target import TARGETS_HELP


def generate(
    sources: Optional[list[str]] = typer.Argument(None, help="prompt sources: .jsonl/.json/.parquet, datasets folder, "
                                                  "stdlib-code, stdlib-docs, humaneval; NAME=LOCATION to name one"),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML with GenerateConfig fields"),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="any GenerateConfig field: --set key=value "
                                             "(repeatable; flags override it)"),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="output folder"),
    target: Optional[str] = typer.Option(None, help=f"target: {TARGETS_HELP}, an HF folder/id or .gguf"),
    backend: Optional[str] = typer.Option(None, help="vllm | hf | openai"),
    dtype: Optional[str] = typer.Option(None, help="float32 | bfloat16 | float16"),
    resume: Optional[bool] = typer.Option(None, "--resume/--no-resume", help="skip ids already written"),
    limit: Optional[int] = typer.Option(None, help="at most this many samples per source"),
    include_heldout: Optional[bool] = typer.Option(None, "--include-heldout", help="allow humaneval as training data"),
    max_turns: Optional[int] = typer.Option(None, help="assistant turns regenerated per conversation"),
    temperature: Optional[float] = typer.Option(None, help="0 = greedy"),
    top_p: Optional[float] = typer.Option(None),
    top_k: Optional[int] = typer.Option(None),
    max_tokens: Optional[int] = typer.Option(None, help="max new tokens per turn"),
    stop: Optional[list[str]] = typer.Option(None, help="stop string (repeatable)"),
    stop_token_id: Optional[list[int]] = typer.Option(None, help="extra stop token id (repeatable)"),
    seed: Optional[int] = typer.Option(None),
    thinking: Optional[bool] = typer.Option(None, "--thinking/--no-thinking", help="chat template enable_thinking"),
    chat_template: Optional[str] = typer.Option(None, help="auto | never (plain continuation)"),
    max_model_len: Optional[int] = typer.Option(None, help="context window"),
    num_shards: Optional[int] = typer.Option(None, help="machines sharing the work"),
    shard_index: Optional[int] = typer.Option(None, help="this machine's shard"),
    flush_every: Optional[int] = typer.Option(None, help="records per Parquet part"),
    chunk_size: Optional[int] = typer.Option(None, help="prompts per backend call"),
    estimate_prompts: Optional[int] = typer.Option(None, help="summary: time for this many more prompts"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress"),
    data_parallel: Optional[int] = typer.Option(None, help="engines, one per GPU"),
    tensor_parallel: Optional[int] = typer.Option(None, help="vllm: GPUs per engine"),
    max_num_seqs: Optional[int] = typer.Option(None, help="vllm: batch size"),
    max_num_batched_tokens: Optional[int] = typer.Option(None, help="vllm: tokens per step"),
    gpu_memory_utilization: Optional[float] = typer.Option(None, help="vllm"),
    enforce_eager: Optional[bool] = typer.Option(None, "--enforce-eager", help="vllm: no compile/graphs"),
    batch_size: Optional[int] = typer.Option(None, help="hf: prompts per batch"),
    device: Optional[str] = typer.Option(None, help="hf: cpu, cuda, auto"),
    server: Optional[list[str]] = typer.Option(None, help="openai: base URL (repeatable)"),
    api_model: Optional[str] = typer.Option(None, help="openai: served model name"),
    concurrency: Optional[int] = typer.Option(None, help="openai: requests in flight per server"),
    request_timeout: Optional[float] = typer.Option(None, help="openai: seconds per request"),
    max_retries: Optional[int] = typer.Option(None, help="openai: retries on 408/429/5xx/timeouts"),
) -> None:
    """Regenerate prompts' answers with the target (the drafter's training data), resumable."""
    from flashdraft.generate.runner import run

    overrides = dict(
        sources=sources or None, output=output, target=target, backend=backend, dtype=dtype, resume=resume,
        limit=limit, include_heldout=include_heldout, max_turns=max_turns, temperature=temperature, top_p=top_p,
        top_k=top_k, max_tokens=max_tokens, stop=stop or None, stop_token_ids=stop_token_id or None, seed=seed,
        thinking=thinking, chat_template=chat_template, max_model_len=max_model_len, num_shards=num_shards,
        shard_index=shard_index, flush_every=flush_every, chunk_size=chunk_size, estimate_prompts=estimate_prompts,
        progress=progress, data_parallel=data_parallel, tensor_parallel=tensor_parallel, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, gpu_memory_utilization=gpu_memory_utilization,
        enforce_eager=enforce_eager, batch_size=batch_size, device=device, servers=server or None,
        api_model=api_model, concurrency=concurrency, request_timeout=request_timeout, max_retries=max_retries,
    )
    with exit_on_error():
        from flashdraft.generate.config import GenerateConfig

        cfg = GenerateConfig.load(config, sets=set_, **overrides)
        if not cfg.sources:
            raise ConfigError("no prompt sources; pass files/folders or stdlib-code, stdlib-docs as arguments")
        run(cfg)


if __name__ == "__main__":
    typer.run(generate)
