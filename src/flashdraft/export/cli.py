"""``flashdraft export``, ``flashdraft import`` and ``flashdraft serve-cmd``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

console = Console()


def _fail(e: Exception) -> None:
    console.print(f"[red]error:[/red] {e}", markup=True, highlight=False)
    raise typer.Exit(2)


def _say(text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def export(
    drafter: Path = typer.Argument(..., help="flashdraft drafter folder (config.json + model.safetensors)."),
    to: str = typer.Option(..., "--to", help="Format: zlab, vllm, speculators or sglang."),
    out: Path = typer.Option(..., "-o", "--out", help="Folder to write (replaced atomically)."),
    target: str = typer.Option("gemma-3-270m", help="Target spec (embedded name, .gguf, HF folder or id)."),
    target_ref: Optional[str] = typer.Option(None, help="Target name written into the files and commands "
                                             "(default: the resolved target folder)."),
    modeling_file: Optional[Path] = typer.Option(None, help="z-lab's dflash.py to place next to the weights "
                                                 "(for AutoModel trust_remote_code)."),
    dtype: Optional[str] = typer.Option(None, help="dtype the server runs (a shipped embedding table is made in it; "
                                        "default: the drafter's)."),
) -> None:
    """Write a trained drafter in a format vLLM, SGLang, speculators or the z-lab code loads unchanged."""
    from flashdraft.export.formats import ExportError, export_drafter
    from flashdraft.export.serve import serve_commands
    from flashdraft.models.drafter import DrafterError
    from flashdraft.models.target import TargetError, load_target, resolve_target_path

    try:
        tgt = load_target(target)
        ref = target_ref or resolve_target_path(target)
        rep = export_drafter(drafter, to, out, tgt, ref, modeling_file, dtype)
    except (ExportError, DrafterError, TargetError) as e:
        _fail(e)
    _say(f"wrote {rep.out} ({rep.format})")
    for n in rep.notes:
        _say(f"  - {n}")
    for name, cmd in serve_commands(rep.out, ref, rep.quirks.family).items():
        _say(f"{name}: {cmd}")


def import_(
    source: Path = typer.Argument(..., help="Checkpoint folder: z-lab DFlash, vLLM-style, SGLang or speculators."),
    out: Path = typer.Option(..., "-o", "--out", help="flashdraft drafter folder to write."),
    from_: str = typer.Option("auto", "--from", help="auto, zlab, vllm, sglang or speculators."),
    target: Optional[str] = typer.Option(None, help="Target to check the fit against (and to fill "
                                         "num_target_layers when the checkpoint lacks it)."),
    mask_token_id: Optional[int] = typer.Option(None, help="Mask token id for checkpoints without one."),
) -> None:
    """Convert a published DFlash drafter into flashdraft's format (for bench decode, run, train)."""
    from flashdraft.export.formats import ExportError
    from flashdraft.export.importers import import_drafter
    from flashdraft.models.target import TargetError, load_target

    try:
        tgt = load_target(target) if target else None
        path, fmt, notes = import_drafter(source, out, from_, tgt, mask_token_id)
    except (ExportError, TargetError) as e:
        _fail(e)
    _say(f"imported {source} ({fmt}) -> {path}")
    for n in notes:
        _say(f"  - {n}")


def serve_cmd(
    drafter: Path = typer.Argument(..., help="Exported drafter folder."),
    target: str = typer.Option(..., help="Target as the server should load it (HF folder or id)."),
    family: Optional[str] = typer.Option(None, help="Target model_type when the folder has no export manifest."),
    port: int = typer.Option(8000),
) -> None:
    """Print the vLLM (baseline and speculative) and SGLang commands that serve an exported drafter."""
    from flashdraft.export.serve import serve_commands

    if not (drafter / "config.json").is_file():
        _fail(FileNotFoundError(f"{drafter}/config.json not found; pass a folder written by `flashdraft export`"))
    for name, cmd in serve_commands(drafter, target, family, port).items():
        _say(f"{name}: {cmd}")
