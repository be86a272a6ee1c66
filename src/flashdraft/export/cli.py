"""``flashdraft export``, ``flashdraft import`` and ``flashdraft serve-cmd``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from flashdraft.errors import FlashdraftError, fail, warn

console = Console()
CONFIG = typer.Option(None, "--config", help="YAML with this command's fields (flags override it)")
SET = typer.Option(None, "--set", help="any field of this command: --set key=value (repeatable; flags override it)")
OVERWRITE = typer.Option(None, "--overwrite/--no-overwrite", help="Write into an existing folder that holds files "
                         "this command did not write (they are kept; same-named ones are replaced).")


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _say(text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def export(
    drafter: Optional[Path] = typer.Argument(None, help="flashdraft drafter folder (config.json + model.safetensors)."),
    to: Optional[str] = typer.Option(None, "--to", help="Format: zlab, vllm, speculators or sglang."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Folder to write (replaced atomically)."),
    target: Optional[str] = typer.Option(None, help="Target spec (embedded name, .gguf, HF folder or id; "
                                         "default gemma-3-270m)."),
    target_ref: Optional[str] = typer.Option(None, help="Target name written into the files and commands "
                                             "(default: --target as given; never a folder of flashdraft's cache)."),
    modeling_file: Optional[Path] = typer.Option(None, help="z-lab's dflash.py to place next to the weights "
                                                 "(for AutoModel trust_remote_code)."),
    dtype: Optional[str] = typer.Option(None, help="dtype the server runs (a shipped embedding table is made in it; "
                                        "default: the drafter's)."),
    overwrite: Optional[bool] = OVERWRITE,
    config: Optional[Path] = CONFIG, set_: Optional[list[str]] = SET,
) -> None:
    """Write a trained drafter in a format vLLM, SGLang, speculators or the z-lab code loads unchanged."""
    from flashdraft.export.config import ExportConfig
    from flashdraft.export.formats import export_drafter
    from flashdraft.export.serve import serve_commands
    from flashdraft.models.target import load_target, resolve_target_path

    try:
        cfg = ExportConfig.load(config, sets=set_, drafter=_str(drafter), to=to, out=_str(out), target=target,
                                target_ref=target_ref, modeling_file=_str(modeling_file), dtype=dtype,
                                overwrite=overwrite)
        tgt = load_target(cfg.target)
        ref = cfg.target_ref or cfg.target  # the files name the target as given; the commands need a local path
        rep = export_drafter(Path(cfg.drafter), cfg.to, Path(cfg.out), tgt, ref,
                             Path(cfg.modeling_file) if cfg.modeling_file else None, cfg.dtype, cfg.overwrite)
    except FlashdraftError as e:
        fail(e)
    _say(f"wrote {rep.out} ({rep.format})")
    for n in rep.notes:
        _say(f"  - {n}")
    for name, cmd in serve_commands(rep.out, cfg.target_ref or resolve_target_path(cfg.target), rep.quirks.family).items():
        _say(f"{name}: {cmd}")


def import_(
    source: Optional[Path] = typer.Argument(None, help="Checkpoint folder: DFlash (z-lab, vLLM-style, SGLang, "
                                            "speculators) or EAGLE-3 (vLLM-style, speculators)."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="flashdraft drafter folder to write."),
    from_: Optional[str] = typer.Option(None, "--from", help="auto (default) or a format of the checkpoint's family: "
                                        "zlab, vllm, sglang, speculators (DFlash); vllm, speculators (EAGLE-3)."),
    target: Optional[str] = typer.Option(None, help="Target to check the fit against (and to fill "
                                         "num_target_layers, EAGLE-3's default layers or LM head when the "
                                         "checkpoint lacks them)."),
    mask_token_id: Optional[int] = typer.Option(None, help="Mask token id for DFlash checkpoints without one."),
    overwrite: Optional[bool] = OVERWRITE,
    config: Optional[Path] = CONFIG, set_: Optional[list[str]] = SET,
) -> None:
    """Convert a published DFlash or EAGLE-3 drafter into flashdraft's format (for bench decode, run, train)."""
    from flashdraft.export.config import ImportConfig
    from flashdraft.export.importers import import_drafter
    from flashdraft.models.target import load_target

    try:
        cfg = ImportConfig.load(config, sets=set_, source=_str(source), out=_str(out), from_=from_, target=target,
                                mask_token_id=mask_token_id, overwrite=overwrite)
        tgt = load_target(cfg.target) if cfg.target else None
        path, fmt, notes = import_drafter(Path(cfg.source), Path(cfg.out), cfg.from_, tgt, cfg.mask_token_id,
                                          cfg.overwrite)
    except FlashdraftError as e:
        fail(e)
    _say(f"imported {cfg.source} ({fmt}) -> {path}")
    for n in notes:
        _say(f"  - {n}")


def serve_cmd(
    drafter: Optional[Path] = typer.Argument(None, help="Exported drafter folder."),
    target: Optional[str] = typer.Option(None, help="Target as the server should load it (HF folder or id)."),
    family: Optional[str] = typer.Option(None, help="Target model_type when the folder has no export manifest."),
    port: Optional[int] = typer.Option(None, help="Server port (default 8000)."),
    config: Optional[Path] = CONFIG, set_: Optional[list[str]] = SET,
) -> None:
    """Print the vLLM (baseline and speculative) and SGLang commands that serve an exported drafter."""
    from flashdraft.export.config import ServeCmdConfig
    from flashdraft.export.formats import ExportError
    from flashdraft.export.serve import serve_commands, serve_warnings

    try:
        cfg = ServeCmdConfig.load(config, sets=set_, drafter=_str(drafter), target=target, family=family, port=port)
        if not (Path(cfg.drafter) / "config.json").is_file():
            raise ExportError(f"{cfg.drafter}/config.json not found; pass a folder written by `flashdraft export`")
    except FlashdraftError as e:
        fail(e)
    for w in serve_warnings(Path(cfg.drafter)):
        warn(w)
    for name, cmd in serve_commands(Path(cfg.drafter), cfg.target, cfg.family, cfg.port).items():
        _say(f"{name}: {cmd}")
