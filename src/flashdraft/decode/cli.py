"""``flashdraft decode`` (alias ``run``): decode one prompt with a registered method and print text, tau and tokens/s."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from flashdraft.config import ConfigError
from flashdraft.decode import DECODERS, DecodeError
from flashdraft.decode.base import unused_settings
from flashdraft.decode.config import DecodeConfig
from flashdraft.errors import fail, warn
from flashdraft.models.chat import ChatError
from flashdraft.models.drafter import DrafterError, drafter_families
from flashdraft.models.target import TARGETS_HELP, TargetError

console = Console()
SETTINGS = {"drafter", "budget", "lookup_min", "lookup_max", "sizing", "tree_temperature", "hints"}  # per-method ones
METHODS_HELP = " | ".join(sorted(DECODERS)) + " (ar and ngram* need no drafter)"


def decode(
    prompt: str = typer.Argument(..., help="The prompt: a user message through the target's chat template (when it has one), else text to continue."),
    target: Optional[str] = typer.Option(None, help=f"{TARGETS_HELP}, a .gguf file, an HF folder or id."),
    drafter: Optional[Path] = typer.Option(
        None, help=f"Drafter folder (config.json architectures: {', '.join(drafter_families())}); needed by drafter methods."),
    method: Optional[str] = typer.Option(None, help=METHODS_HELP),
    budget: Optional[int] = typer.Option(None, help="Drafted nodes per round: ddtree / ngram_tree (default 32), eagle3_tree (default 60), ngram / eagle3 chain length (default 7)."),
    lookup_min: Optional[int] = typer.Option(None, "--lookup-min", help="ngram*: shortest n-gram matched (default 1; vLLM's prompt_lookup_min)."),
    lookup_max: Optional[int] = typer.Option(None, "--lookup-max", help="ngram*: longest n-gram matched (default 3)."),
    sizing: Optional[str] = typer.Option(None, help="ddtree*: fixed (default, the whole budget) | cost (what pays on this machine)."),
    tree_temperature: Optional[float] = typer.Option(None, "--tree-temperature", help="ddtree*: temperature of the marginals the tree is built from (default: the drafter's calibrated one, else 1)."),
    hints: Optional[str] = typer.Option(None, help="dflash / ddtree*: lookup (the draft slots hold prompt lookup's chain) | none (MASK); default: the drafter's block_hints."),
    chat_template: Optional[str] = typer.Option(None, "--chat-template", help="auto (default): through the target's chat template when it has one, as a served user's prompt | never: continue the raw text."),
    thinking: Optional[bool] = typer.Option(None, "--thinking/--no-thinking", help="The chat template's enable_thinking switch (default: the template's own)."),
    system: Optional[str] = typer.Option(None, help="A system message before the prompt (chat template only)."),
    temperature: Optional[float] = typer.Option(None, help="0 = greedy; > 0 = lossless sampling."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens"),
    seed: Optional[int] = typer.Option(None),
    dtype: Optional[str] = typer.Option(None, help="float32 | bfloat16 | float16"),
    compare_ar: bool = typer.Option(False, "--compare-ar", help="Also decode with AR: speedup and token identity."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML with the same field names; flags override it."),
    sets: Optional[list[str]] = typer.Option(None, "--set", help="key=value over the config (repeatable), e.g. --set device=cuda"),
) -> None:
    """Decode one prompt; print the text, tau (tokens per target forward) and tokens/s."""
    from flashdraft.decode import build_decoder
    from flashdraft.models.drafter import load_drafter
    from flashdraft.models.target import load_target

    try:
        cfg = DecodeConfig.load(
            config, sets=sets, target=target, drafter=str(drafter) if drafter else None, method=method, budget=budget,
            temperature=temperature, max_new_tokens=max_new_tokens, seed=seed, dtype=dtype, lookup_min=lookup_min,
            lookup_max=lookup_max, sizing=sizing, tree_temperature=tree_temperature,
            hints=hints, chat_template=chat_template, thinking=thinking, system=system,
        )
        ignored = unused_settings(cfg.method, cfg.model_fields_set & SETTINGS)
        if ignored:
            warn(f"--method {cfg.method} ignores " + ", ".join("--" + n.replace("_", "-") for n in ignored))
        tgt = load_target(cfg.target, dtype=cfg.dtype, device=cfg.device)
        d = load_drafter(cfg.drafter, tgt) if cfg.drafter else None
        chat = cfg.chat
        for note in chat.notes(tgt.tokenizer, [d] if d else []):
            warn(note)
        options = {k: getattr(cfg, k) for k in DECODERS[cfg.method].OPTIONS if k in DecodeConfig.model_fields}
        dec = build_decoder(cfg.method, tgt, d, budget=cfg.budget, **options)
        ids = chat.encode(tgt, prompt)
        res = dec.generate(ids, cfg.max_new_tokens, temperature=cfg.temperature, seed=cfg.seed)
        ar = build_decoder("ar", tgt).generate(ids, cfg.max_new_tokens, cfg.temperature, cfg.seed) if compare_ar else None
    except (ChatError, ConfigError, DecodeError, DrafterError, TargetError) as e:
        fail(e)
    s = res.stats
    templated = chat.uses_template(tgt.tokenizer)
    typer.echo(f"prompting: {chat.describe(tgt.tokenizer)}", err=True)
    console.print(tgt.decode(ids) if templated else prompt, style="bold", end="", markup=False, highlight=False)
    console.print(tgt.decode(res.tokens), markup=False, highlight=False)
    if s.rounds:
        typer.echo(f"\nmethod={cfg.method} new_tokens={s.new_tokens} rounds={s.rounds} tau={s.tau_mean:.2f} "
                   f"tokens/s={s.tokens_per_second:.1f} (decode, prefill excluded)")
        if cfg.method != "ar":
            typer.echo("tau histogram: " + " ".join(f"{k}:{v}" for k, v in s.tau_histogram().items()))
    else:
        typer.echo(f"\nmethod={cfg.method} new_tokens={s.new_tokens} rounds=0 tau=n/a tokens/s=n/a (the only token "
                   "came from the prefill: it was a stop token or --max-new-tokens is 1, so no verify round ran)")
    if ar is not None:
        same = "identical" if ar.tokens == res.tokens else "DIFFERENT"
        if s.rounds and ar.stats.rounds:
            speed = f"{s.tokens_per_second / ar.stats.tokens_per_second:.2f}x"
        else:
            speed = "n/a (no decode step to time)"
        typer.echo(f"ar tokens/s={ar.stats.tokens_per_second:.1f}  speedup={speed}  tokens {same} to AR")
