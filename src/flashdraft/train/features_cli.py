"""``flashdraft features``: run the frozen target once over the training data and cache its features
(see :mod:`flashdraft.train.features`). Data, target and layer choice follow the train config, so
``--config run.yaml`` builds the cache that run reads."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from flashdraft.errors import exit_on_error
from flashdraft.models.target import TARGETS_HELP
from flashdraft.train.objective import TrainError


def parse_layer_ids(text: str | None) -> list[int] | None:
    """``"1,4,8"`` (or space separated) -> [1, 4, 8]."""
    if text is None:
        return None
    try:
        return [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise typer.BadParameter(f"--layer-ids {text!r} must be integers separated by commas, e.g. 1,4,8") from None


def features(
    out: Path = typer.Option(..., "--out", help="cache folder: features.json + shard-*.safetensors"),
    config: Optional[Path] = typer.Option(None, "--config", help="train YAML: target, data, max_len, block_size, layers"),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="any train config field: --set key=value "
                                             "(repeatable; flags override it)"),
    data: Optional[list[str]] = typer.Option(None, "--data", help="JSONL/JSON/Parquet records (repeatable)"),
    target: Optional[str] = typer.Option(None, "--target", help=f"target: {TARGETS_HELP}, a .gguf file, an HF folder or id"),
    layer_ids: Optional[str] = typer.Option(None, "--layer-ids", help="target layers, e.g. 1,4,8 (default: the drafter's rule)"),
    num_layers: Optional[int] = typer.Option(None, "--num-layers", help="drafter layers: picks the default layer ids"),
    max_len: Optional[int] = typer.Option(None, "--max-len", help="truncate sequences (as training does)"),
    block_size: Optional[int] = typer.Option(None, "--block-size", help="skip sequences shorter than a block (as training)"),
    shard_size: int = typer.Option(256, "--shard-size", min=1, help="examples per shard file"),
    dtype: str = typer.Option("bfloat16", "--dtype", help="stored dtype: bfloat16, float32 or float16"),
    with_final: Optional[bool] = typer.Option(
        None, "--with-final/--no-final", help="also store the final hidden state (loss kl; default: on iff loss is kl)"
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace a cache made for other data/target/layers"),
    device: Optional[str] = typer.Option(None, "--device", help="where the target runs (default: cuda if available)"),
    target_dtype: str = typer.Option("float32", "--target-dtype", help="target weights dtype"),
    rank: int = typer.Option(0, "--rank", min=0, help="with --world-size: this process writes shards s % world == rank"),
    world_size: int = typer.Option(1, "--world-size", min=1),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
    stats_sequences: int = typer.Option(64, "--stats-sequences", min=1,
                                        help="sequences sampled for the feature statistics (feature_stats.json)"),
) -> None:
    """Compute the target's features over the training data once and store them for training."""
    import torch

    from flashdraft.io import check_output_dir
    from flashdraft.models.target import check_target_layer_ids, load_target
    from flashdraft.train.config import TrainConfig
    from flashdraft.train.data import load_examples
    from flashdraft.train.features import FeatureStore, write_features
    from flashdraft.train.objectives import objective_class

    ids = parse_layer_ids(layer_ids)
    flags = dict(data=data or None, target=target, target_layer_ids=ids, num_layers=num_layers, max_len=max_len,
                 block_size=block_size)
    t0 = time.perf_counter()
    with exit_on_error():
        cfg = TrainConfig.load(config, sets=set_, **flags)
        if not cfg.data:
            raise TrainError("no data: pass --data FILE (JSONL/Parquet records) or set data: in the --config YAML")
        check_output_dir(out)  # before the target loads
        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        tgt = load_target(cfg.target, dtype=target_dtype, device=dev)
        objective = objective_class(cfg.objective)
        ids = objective.feature_layer_ids(tgt, cfg)
        check_target_layer_ids(ids, tgt.num_layers, tgt.name)
        examples, stats = load_examples(cfg.data, tgt, cfg.max_len, cfg.block_size, cfg.append_eos)
        source = {"data": list(cfg.data), "max_len": cfg.max_len, "block_size": cfg.block_size,
                  "append_eos": cfg.append_eos, "records": stats.records}
        final = with_final if with_final is not None else objective.wants_final(cfg)
        path = write_features(tgt, examples, ids, out, shard_size=shard_size, dtype=dtype, with_final=final,
                              progress=progress, overwrite=overwrite, source=source, rank=rank, world_size=world_size)
        store = FeatureStore(path)
    from flashdraft.io import atomic_write_text
    from flashdraft.train.diagnostics import feature_stats, format_feature_stats, store_channel_rms

    stats = None
    if all(p.is_file() for p in store.shard_files):  # every shard written: statistics of a sample
        stats = feature_stats(store_channel_rms(store, stats_sequences), store.layer_ids)
        atomic_write_text(Path(path) / "feature_stats.json", json.dumps(stats, indent=1) + "\n")
        typer.echo(format_feature_stats(stats), err=True)
    files = [p for p in store.shard_files if p.is_file()]
    summary = {
        "out": str(path), "examples": store.n_examples, "tokens": store.n_tokens, "shards": len(store.shard_files),
        "shards_missing": len(store.shard_files) - len(files), "bytes": sum(p.stat().st_size for p in files),
        "layer_ids": store.layer_ids, "dtype": dtype, "with_final": store.with_final,
        "seconds": round(time.perf_counter() - t0, 2),
        "feature_stats": None if stats is None else str(Path(path) / "feature_stats.json"),
    }
    typer.echo(json.dumps(summary))
