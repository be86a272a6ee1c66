"""``flashdraft bench {decode,serve,model}``: measured speedups, a serving sweep and the cost model."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from flashdraft.errors import fail, warn
from flashdraft.models.target import TARGETS_HELP

app = typer.Typer(help="Benchmarks: decode (AR/DFlash/DDTree), serve (concurrency sweep), model (cost model).",
                  no_args_is_help=True, pretty_exceptions_enable=False)
console = Console()


def _ints(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{s!r}: give comma-separated integers, e.g. 4,8,16") from None


CONFIG_HELP = "YAML with the same field names (bench.config); --set and flags override it."
SET_HELP = "key=value over the config (repeatable), e.g. --set limit=8"


def _config(cls, config: Optional[Path], sets: Optional[List[str]], **flags):
    from flashdraft.config import ConfigError

    try:
        return cls.load(config, sets=sets, **{k: v for k, v in flags.items() if v not in (None, [], ())})
    except ConfigError as e:
        fail(e)


@app.command()
def decode(
    target: Optional[str] = typer.Option(None, help=f"Target: {TARGETS_HELP}, a .gguf file or an HF folder."),
    drafter: Optional[List[Path]] = typer.Option(None, help="Drafter folder(s) of any registered family; repeat for several (none: AR vs ngram)."),
    prompts: Optional[List[str]] = typer.Option(None, help="A named set (code-test, math-test, chat-test, multilingual-test; -dev to choose), 'humaneval' (default) or a JSONL file with 'prompt' and/or 'messages'."),
    chat_template: Optional[str] = typer.Option(None, "--chat-template", help="auto (default): prompts through the target's chat template when it has one, as served | never: raw text."),
    thinking: Optional[bool] = typer.Option(None, "--thinking/--no-thinking", help="The chat template's enable_thinking switch (default: the template's own)."),
    system: Optional[str] = typer.Option(None, help="A system message before every prompt (chat template only)."),
    limit: Optional[int] = typer.Option(None, help="Prompts per set (default 4)."),
    budgets: Optional[str] = typer.Option(None, help="DDTree budgets, comma-separated (default 4,8,16,32,64,128)."),
    temperatures: Optional[str] = typer.Option(None, help="Comma-separated temperatures, e.g. 0,1 (default 0)."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Default 32."),
    repeats: Optional[int] = typer.Option(None, help="Runs per prompt and variant (median; default 3)."),
    dtype: Optional[str] = typer.Option(None, help="float32 (default) | bfloat16 | float16"),
    threads: Optional[int] = typer.Option(None, help="torch intra-op threads (default 1, for a shared machine)."),
    ngram: Optional[bool] = typer.Option(None, "--ngram/--no-ngram", help="Also run prompt lookup (ngram, ngram_tree@b); default on."),
    lookup_min: Optional[int] = typer.Option(None, "--lookup-min", help="Prompt lookup's shortest n-gram match (default 1)."),
    lookup_max: Optional[int] = typer.Option(None, "--lookup-max", help="Prompt lookup's longest n-gram match (default 3)."),
    sizing: Optional[str] = typer.Option(None, help="DDTree sizings, comma-separated: fixed (default), cost (rows @b+cost: the tree cut to what pays on this machine)."),
    hints: Optional[str] = typer.Option(None, help="DFlash block hints, comma-separated: lookup, none (MASK, as other engines draft); several give each drafter rows per mode (<drafter>+hints=none/...); default: each drafter's own."),
    rows: Optional[str] = typer.Option(None, help="Only the rows matching these comma-separated shell patterns, e.g. ngram,*/dflash,*/ddtree@32+cost (AR always runs)."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Default runs/bench_decode."),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP),
    sets: Optional[List[str]] = typer.Option(None, "--set", help=SET_HELP),
) -> None:
    """AR vs DFlash vs DDTree (budget sweep) vs same-budget chain vs prompt lookup: tau, TPOT, speedup; JSON/MD/PNG."""
    import torch

    from flashdraft.bench.config import BenchDecodeConfig
    from flashdraft.bench.decode_bench import BenchError, drafter_names, load_prompts, markdown_table, run_decode_bench
    from flashdraft.bench.plots import decode_plots
    from flashdraft.decode.base import DecodeError
    from flashdraft.io import OutputPathError, atomic_write_text, check_output_dir
    from flashdraft.models.chat import ChatError
    from flashdraft.models.drafter import DrafterError, load_drafter
    from flashdraft.models.target import TargetError, load_target

    cfg = _config(BenchDecodeConfig, config, sets, target=target, drafter=[str(d) for d in drafter or []],
                  prompts=prompts, chat_template=chat_template, thinking=thinking, system=system, limit=limit, budgets=_ints(budgets) if budgets else None,
                  temperatures=[float(t) for t in temperatures.split(",")] if temperatures else None,
                  max_new_tokens=max_new_tokens, repeats=repeats, dtype=dtype, threads=threads, ngram=ngram,
                  lookup_min=lookup_min, lookup_max=lookup_max, sizing=sizing.split(",") if sizing else None,
                  hints=hints.split(",") if hints else None, rows=rows.split(",") if rows else None,
                  out=str(out) if out else None)
    out = Path(cfg.out)
    torch.set_num_threads(cfg.threads)
    try:
        check_output_dir(out)  # before the target loads: a bad -o is named at once
        sets_ = dict(load_prompts(p, cfg.limit) for p in cfg.prompts)
        tgt = load_target(cfg.target, dtype=cfg.dtype, device=cfg.device)
        drafters = {n: load_drafter(d, tgt) for n, d in zip(drafter_names(cfg.drafter), cfg.drafter)}
        chat = cfg.chat
        for note in chat.notes(tgt.tokenizer, drafters.values()):
            warn(note)
        res = run_decode_bench(tgt, drafters, sets_, cfg.budgets, cfg.temperatures, cfg.max_new_tokens, cfg.repeats, out,
                               log=lambda m: console.print(m, markup=False, highlight=False), ngram=cfg.ngram,
                               lookup=dict(lookup_min=cfg.lookup_min, lookup_max=cfg.lookup_max), sizings=cfg.sizing,
                               hints=cfg.hints, rows=cfg.rows, chat=chat)
    except (BenchError, ChatError, DecodeError, DrafterError, OutputPathError, TargetError) as e:
        fail(e)
    md = markdown_table(res)
    atomic_write_text(out / "table.md", md)
    plots = decode_plots(res, out)
    console.print(md, markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {out / 'results.json'}, {out / 'table.md'}, " + ", ".join(str(p) for p in plots))


@app.command()
def serve(
    baseline_url: Optional[str] = typer.Option(None, help="OpenAI-compatible base URL of the plain server (…/v1); required."),
    speculative_url: Optional[str] = typer.Option(None, help="Base URL of the speculative server (…/v1)."),
    prompts: Optional[str] = typer.Option(None, help="'humaneval' (default) or a JSONL file with 'prompt'."),
    num_prompts: Optional[int] = typer.Option(None, help="Requests per concurrency level (default 32)."),
    max_tokens: Optional[int] = typer.Option(None, help="Output tokens per request (fixed with ignore_eos; default 128)."),
    concurrency: Optional[str] = typer.Option(None, help="Comma-separated levels (default 1,2,4,8,16,32)."),
    ignore_eos: Optional[bool] = typer.Option(None, "--ignore-eos/--no-ignore-eos", help="Send ignore_eos (vLLM) so every output has max_tokens; default on."),
    target: Optional[str] = typer.Option(None, help="Only for the printed vLLM commands."),
    drafter: Optional[str] = typer.Option(None, help="Only for the printed vLLM commands."),
    block_size: Optional[int] = typer.Option(None, help="Drafter block size B (num_speculative_tokens = B-1; default 16)."),
    timeout_s: Optional[float] = typer.Option(None, help="Default 300."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Default runs/bench_serve."),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP),
    sets: Optional[List[str]] = typer.Option(None, "--set", help=SET_HELP),
) -> None:
    """Concurrency sweep: throughput, TTFT, TPOT (percentiles), per-level speedup, spec-decode acceptance."""
    from flashdraft.bench.config import BenchServeConfig
    from flashdraft.bench.decode_bench import BenchError, load_prompt_set
    from flashdraft.bench.plots import serve_plots
    from flashdraft.bench.serve_bench import ServeBenchError, run_serve_bench, serve_table, vllm_commands
    from flashdraft.io import atomic_write_text

    cfg = _config(BenchServeConfig, config, sets, baseline_url=baseline_url, speculative_url=speculative_url,
                  prompts=prompts, num_prompts=num_prompts, max_tokens=max_tokens,
                  concurrency=_ints(concurrency) if concurrency else None, ignore_eos=ignore_eos, target=target,
                  drafter=drafter, block_size=block_size, timeout_s=timeout_s, out=str(out) if out else None)
    if not cfg.baseline_url:
        fail(ValueError("bench serve needs the plain server's URL: pass --baseline-url or set baseline_url"))
    out = Path(cfg.out)
    console.print("servers a user would start (baseline, speculative):")
    for c in vllm_commands(cfg.target, cfg.drafter, cfg.block_size):
        console.print("  " + c, markup=False, highlight=False)
    endpoints = {"baseline": cfg.baseline_url} | ({"speculative": cfg.speculative_url} if cfg.speculative_url else {})
    try:
        _, texts = load_prompt_set(cfg.prompts)
        texts = (texts * cfg.num_prompts)[: cfg.num_prompts]
        res = run_serve_bench(endpoints, texts, cfg.max_tokens, cfg.concurrency, out, cfg.ignore_eos, cfg.timeout_s,
                              log=lambda m: console.print(m, markup=False, highlight=False))
    except (BenchError, ServeBenchError) as e:
        fail(e)
    md = serve_table(res)
    atomic_write_text(out / "serve_table.md", md)
    plots = serve_plots(res, out)
    console.print(md, markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {out / 'serve_results.json'}, {out / 'serve_table.md'}, {plots[0]}")


@app.command()
def model(
    input: Optional[Path] = typer.Option(None, "--input", help="Cost-model input YAML/JSON (CostModelInput)."),
    preset: Optional[str] = typer.Option(None, help="kimi-k2-pcie8 | h200-dense8b (assumed example inputs)."),
    profile: Optional[bool] = typer.Option(None, "--profile", help="Measure costs on this machine (target + drafter)."),
    target: Optional[str] = typer.Option(None, help="--profile: target spec (default gemma-3-270m)."),
    drafter: Optional[Path] = typer.Option(None, help="--profile: drafter folder (its pass is timed)."),
    decode_results: Optional[Path] = typer.Option(None, help="results.json of `bench decode`: acceptance + validation."),
    tp: Optional[int] = typer.Option(None), gpus: Optional[int] = typer.Option(None),
    interconnect: Optional[str] = typer.Option(None, help="pcie | nvlink | none"),
    latency_us: Optional[float] = typer.Option(None), bandwidth_gbps: Optional[float] = typer.Option(None),
    concurrency: Optional[str] = typer.Option(None), budgets: Optional[str] = typer.Option(None),
    profile_sizes: Optional[str] = typer.Option(None, help="--profile: tokens per timed forward (default 1,2,4,8,16,32,64,129)."),
    profile_repeats: Optional[int] = typer.Option(None, help="--profile: timed runs per size (median; 1 warm-up; default 5)."),
    threads: Optional[int] = typer.Option(None, help="Default 1."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Default runs/bench_model."),
    config: Optional[Path] = typer.Option(None, "--config", help=CONFIG_HELP),
    sets: Optional[List[str]] = typer.Option(None, "--set", help=SET_HELP),
) -> None:
    """Predict speedup vs concurrency for chain and tree per budget; validate against `bench decode` at batch 1."""
    from flashdraft.bench.config import BenchModelConfig
    from flashdraft.bench.modelcmd import ModelCmdError, run_model_command

    cfg = _config(BenchModelConfig, config, sets, input=str(input) if input else None, preset=preset, profile=profile,
                  target=target, drafter=str(drafter) if drafter else None,
                  decode_results=str(decode_results) if decode_results else None, tp=tp, gpus=gpus,
                  interconnect=interconnect, latency_us=latency_us, bandwidth_gbps=bandwidth_gbps,
                  concurrency=_ints(concurrency) if concurrency else None, budgets=_ints(budgets) if budgets else None,
                  profile_sizes=_ints(profile_sizes) if profile_sizes else None, profile_repeats=profile_repeats,
                  threads=threads, out=str(out) if out else None)
    try:
        run_model_command(input=Path(cfg.input) if cfg.input else None, preset=cfg.preset, profile=cfg.profile,
                          target=cfg.target, drafter=Path(cfg.drafter) if cfg.drafter else None,
                          decode_results=Path(cfg.decode_results) if cfg.decode_results else None,
                          hardware=dict(tp=cfg.tp, gpus=cfg.gpus, interconnect=cfg.interconnect,
                                        latency_us=cfg.latency_us, bandwidth_gbps=cfg.bandwidth_gbps),
                          concurrency=cfg.concurrency, budgets=cfg.budgets, threads=cfg.threads, out=Path(cfg.out),
                          console=console, profile_opts=dict(sizes=cfg.profile_sizes, repeats=cfg.profile_repeats))
    except ModelCmdError as e:
        fail(e)


if __name__ == "__main__":
    app()
