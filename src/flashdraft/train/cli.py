"""``flashdraft train``: YAML config (``--config``) + flag overrides -> a trained, exported DFlash drafter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from flashdraft.errors import exit_on_error
from flashdraft.models.target import TARGETS_HELP
from flashdraft.train.config import TrainConfig


def train(
    config: Optional[Path] = typer.Option(None, "--config", help="YAML file of train config fields"),
    data: Optional[list[str]] = typer.Option(None, "--data", help="JSONL/JSON/Parquet records (repeatable)"),
    out_dir: Optional[str] = typer.Option(None, "--out-dir", help="run folder: checkpoints/, metrics.jsonl, drafter/"),
    target: Optional[str] = typer.Option(None, "--target", help=f"target: {TARGETS_HELP}, a .gguf file, an HF folder or id"),
    num_layers: Optional[int] = typer.Option(None, "--num-layers", help="drafter decoder layers"),
    block_size: Optional[int] = typer.Option(None, "--block-size", help="block size B (B-1 drafted tokens)"),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="optimizer steps (overrides --epochs)"),
    epochs: Optional[float] = typer.Option(None, "--epochs"),
    lr: Optional[float] = typer.Option(None, "--lr"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size"),
    grad_accum: Optional[int] = typer.Option(None, "--grad-accum"),
    max_anchors: Optional[int] = typer.Option(None, "--max-anchors"),
    loss: Optional[str] = typer.Option(None, "--loss", help="ce (target tokens) or kl (target logits)"),
    draft_vocab_size: Optional[str] = typer.Option(
        None, "--draft-vocab-size", help="reduced draft vocabulary of N ids (d2t/t2d), or auto (by the target's "
        "size); its coverage per domain is printed and saved in the drafter folder (vocab_coverage.json)"),
    draft_vocab_reserve: Optional[float] = typer.Option(
        None, "--draft-vocab-reserve", help="share of the draft vocabulary split evenly over the data's domains"),
    draft_vocab_corpus: Optional[list[str]] = typer.Option(
        None, "--draft-vocab-corpus", help="records or .txt whose tokens also count towards the draft vocabulary "
        "(repeatable)"),
    bf16: Optional[bool] = typer.Option(None, "--bf16/--no-bf16", help="bf16 autocast for the drafter"),
    eval_prompts: Optional[str] = typer.Option(None, "--eval-prompts", help="JSONL of held-out {prompt}/{prompt_ids}"),
    max_minutes: Optional[float] = typer.Option(None, "--max-minutes", help="stop with a checkpoint after this time"),
    features: Optional[str] = typer.Option(None, "--features", help="offline feature cache (flashdraft features)"),
    resume: Optional[bool] = typer.Option(None, "--resume/--no-resume", help="continue from the newest checkpoint"),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="any other field: --set key=value (repeatable)"),
) -> None:
    """Train a DFlash drafter on the target's own responses; export it to OUT_DIR/drafter (z-lab format)."""
    from flashdraft.train.dist import init_distributed
    from flashdraft.train.loop import Trainer

    flags = dict(
        data=data or None, out_dir=out_dir, target=target, num_layers=num_layers, block_size=block_size,
        max_steps=max_steps, epochs=epochs, lr=lr, batch_size=batch_size, grad_accum=grad_accum,
        max_anchors=max_anchors, loss=loss, bf16=bf16, eval_prompts=eval_prompts, max_minutes=max_minutes,
        resume=resume, features=features, draft_vocab_size=draft_vocab_size,
        draft_vocab_reserve=draft_vocab_reserve, draft_vocab_corpus=draft_vocab_corpus or None,
    )
    with exit_on_error():
        cfg = TrainConfig.load(config, sets=set_, **flags)
        joined = init_distributed()  # torchrun: one process per GPU (or gloo processes on CPU)
        try:
            result = Trainer(cfg).run()
        finally:
            if joined:
                import torch.distributed as dist

                dist.destroy_process_group()
    summary = {
        "step": result.step, "total_steps": result.total_steps, "stopped": result.stopped,
        "checkpoint": str(result.checkpoint) if result.checkpoint else None,
        "drafter": str(result.final_drafter) if result.final_drafter else None,
        "eval_tau": result.eval["tau"] if result.eval else None,
    }
    typer.echo(json.dumps(summary))
    if result.stopped == "signal":
        raise typer.Exit(130)
