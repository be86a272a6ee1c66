"""``flashdraft run``: decode one prompt with AR, DFlash, DDTree or prompt lookup (ngram) and print text, tau and tokens/s."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from flashdraft.config import ConfigError
from flashdraft.decode.base import DecodeError
from flashdraft.decode.config import DecodeConfig
from flashdraft.models.dflash import DrafterError
from flashdraft.models.target import TargetError

console = Console()


def run(
    prompt: str = typer.Argument(..., help="Text to continue (tokenised with the target's tokenizer)."),
    target: Optional[str] = typer.Option(None, help="gemma-3-270m (embedded default), a .gguf file, an HF folder or id."),
    drafter: Optional[Path] = typer.Option(None, help="DFlash drafter folder (z-lab format); needed by dflash/ddtree."),
    method: Optional[str] = typer.Option(None, help="ar | dflash | ddtree | ngram (prompt lookup, no drafter) | ngram_tree | ddtree_ngram (DDTree + lookup chain)"),
    budget: Optional[int] = typer.Option(None, help="Drafted nodes per round: ddtree / ngram_tree (default 32), ngram chain length (default 7)."),
    temperature: Optional[float] = typer.Option(None, help="0 = greedy; > 0 = lossless sampling."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens"),
    seed: Optional[int] = typer.Option(None),
    dtype: Optional[str] = typer.Option(None, help="float32 | bfloat16 | float16"),
    compare_ar: bool = typer.Option(False, "--compare-ar", help="Also decode with AR: speedup and token identity."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML with the same field names; flags override it."),
) -> None:
    """Decode one prompt; print the text, tau (tokens per target forward) and tokens/s."""
    from flashdraft.decode.base import build_decoder
    from flashdraft.models.dflash import DFlashDrafter
    from flashdraft.models.target import load_target

    try:
        cfg = DecodeConfig.load(
            config, target=target, drafter=str(drafter) if drafter else None, method=method, budget=budget,
            temperature=temperature, max_new_tokens=max_new_tokens, seed=seed, dtype=dtype,
        )
        tgt = load_target(cfg.target, dtype=cfg.dtype, device=cfg.device)
        d = DFlashDrafter.from_pretrained(cfg.drafter, tgt) if cfg.drafter else None
        dec = build_decoder(cfg.method, tgt, d, budget=cfg.budget)
        ids = tgt.encode(prompt)
        res = dec.generate(ids, cfg.max_new_tokens, temperature=cfg.temperature, seed=cfg.seed)
        ar = build_decoder("ar", tgt).generate(ids, cfg.max_new_tokens, cfg.temperature, cfg.seed) if compare_ar else None
    except (ConfigError, DecodeError, DrafterError, TargetError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None
    s = res.stats
    console.print(prompt, style="bold", end="", markup=False, highlight=False)
    console.print(tgt.decode(res.tokens), markup=False, highlight=False)
    console.print(
        f"\nmethod={cfg.method} new_tokens={s.new_tokens} rounds={s.rounds} tau={s.tau_mean:.2f} "
        f"tokens/s={s.tokens_per_second:.1f} (decode, prefill excluded)"
    )
    if cfg.method != "ar":
        console.print("tau histogram: " + " ".join(f"{k}:{v}" for k, v in s.tau_histogram().items()))
    if ar is not None:
        same = "identical" if ar.tokens == res.tokens else "DIFFERENT"
        speed = s.tokens_per_second / ar.stats.tokens_per_second if ar.stats.tokens_per_second else float("nan")
        console.print(f"ar tokens/s={ar.stats.tokens_per_second:.1f}  speedup={speed:.2f}x  tokens {same} to AR")
