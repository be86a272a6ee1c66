"""``flashdraft demo``: the whole pipeline on an embedded target (or any target), ending in a report folder."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from flashdraft.errors import exit_on_error
from flashdraft.models.target import TARGETS_HELP


def demo(
    out: Optional[str] = typer.Option(None, "--out", help="run folder (default runs/demo)"),
    target: Optional[str] = typer.Option(None, "--target", help=f"target: {TARGETS_HELP}, a .gguf file or an HF folder/id"),
    chat_template: Optional[str] = typer.Option(None, "--chat-template", help="auto (default): prompts through the target's chat template when it has one | never: raw text"),
    minutes: Optional[float] = typer.Option(None, "--minutes", help="training budget in minutes (default 4)"),
    fresh: bool = typer.Option(False, "--fresh", help="run every stage again (default: skip finished stages)"),
    drafter: Optional[str] = typer.Option(None, "--drafter", help="the shipped drafter benched next to the new one (default: the repository's asset for the target, if any)"),
    init_from: Optional[str] = typer.Option(None, "--init-from", help="fine-tune this drafter (default: --drafter)"),
    scratch: bool = typer.Option(False, "--scratch", help="train a fresh drafter instead of fine-tuning"),
    prompts: Optional[int] = typer.Option(None, "--prompts", help="training prompts to generate answers for"),
    new_tokens: Optional[int] = typer.Option(None, "--new-tokens", help="generate: max new tokens per prompt"),
    backend: Optional[str] = typer.Option(None, "--backend", help="generate backend: auto, vllm or hf"),
    bench_prompts: Optional[int] = typer.Option(None, "--bench-prompts", help="held-out HumanEval prompts to bench"),
    bench_tokens: Optional[int] = typer.Option(None, "--bench-tokens", help="bench: new tokens per prompt"),
    budgets: Optional[str] = typer.Option(None, "--budgets", help="DDTree budgets, comma-separated (default 8,16)"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch intra-op threads (default 1)"),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML of demo fields (flags override it)"),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="any demo field: --set key=value (repeatable)"),
) -> None:
    """prompts -> generate -> mix report -> train -> bench decode -> export -> report.html/report.md.
    A finished stage is skipped on a re-run (an interrupted one resumes) unless --fresh."""
    import torch

    from flashdraft.demo.pipeline import DemoConfig, demo_stages
    from flashdraft.demo.stages import run_stages

    with exit_on_error():
        cfg = DemoConfig.load(config, sets=set_, out=out, target=target, chat_template=chat_template, minutes=minutes, drafter=drafter, init_from=init_from,
                              prompts=prompts, new_tokens=new_tokens, backend=backend, bench_prompts=bench_prompts,
                              bench_tokens=bench_tokens, threads=threads, fine_tune=False if scratch else None,
                              budgets=[int(b) for b in budgets.split(",")] if budgets else None)
        torch.set_num_threads(cfg.threads)
        typer.echo(f"demo: {cfg.target} -> {cfg.out} (stage markers in {Path(cfg.out) / 'stages'})")
        try:
            markers = run_stages(demo_stages(cfg), Path(cfg.out), fresh=fresh, say=typer.echo)
        except KeyboardInterrupt:
            typer.echo("\ninterrupted; finished stages keep their markers: rerun the same command to resume")
            raise typer.Exit(130) from None
    rep = markers["report"]["outputs"]
    typer.echo(f"report: {rep['html']}\n        {rep['markdown']}")
