"""``flashdraft bench {decode,serve,model}``: measured speedups, a serving sweep and the cost model."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

app = typer.Typer(help="Benchmarks: decode (AR/DFlash/DDTree), serve (concurrency sweep), model (cost model).",
                  no_args_is_help=True, pretty_exceptions_enable=False)
console = Console()


def _ints(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{s!r}: give comma-separated integers, e.g. 4,8,16") from None


def _fail(e: Exception) -> None:
    console.print(f"[red]error:[/red] {e}", markup=True, highlight=False)
    raise typer.Exit(2)


@app.command()
def decode(
    target: str = typer.Option("gemma-3-270m", help="Target spec (embedded name, .gguf, HF folder)."),
    drafter: List[Path] = typer.Option([], help="DFlash drafter folder(s); repeat for several (none: AR vs ngram)."),
    prompts: List[str] = typer.Option(["humaneval"], help="'humaneval' (offline) or a JSONL file with 'prompt'."),
    limit: int = typer.Option(4, help="Prompts per set."),
    budgets: str = typer.Option("4,8,16,32,64,128", help="DDTree budgets (comma-separated)."),
    temperatures: str = typer.Option("0", help="Comma-separated temperatures, e.g. 0,1."),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens"),
    repeats: int = typer.Option(3, help="Runs per prompt and variant (median)."),
    dtype: str = typer.Option("float32"),
    threads: int = typer.Option(1, help="torch intra-op threads (1 on a shared machine)."),
    ngram: bool = typer.Option(True, "--ngram/--no-ngram", help="Also run prompt lookup (ngram, ngram_tree@b)."),
    out: Path = typer.Option(Path("runs/bench_decode"), "-o", "--out"),
) -> None:
    """AR vs DFlash vs DDTree (budget sweep) vs same-budget chain vs prompt lookup: tau, TPOT, speedup; JSON/MD/PNG."""
    import torch

    from flashdraft.bench.decode_bench import BenchError, load_prompt_set, markdown_table, run_decode_bench
    from flashdraft.bench.plots import decode_plots
    from flashdraft.decode.base import DecodeError
    from flashdraft.io import atomic_write_text
    from flashdraft.models.drafter import DrafterError, load_drafter
    from flashdraft.models.target import TargetError, load_target

    torch.set_num_threads(threads)
    try:
        sets = dict(load_prompt_set(p, limit) for p in prompts)
        tgt = load_target(target, dtype=dtype)
        drafters = {Path(d).name: load_drafter(d, tgt) for d in drafter}
        console.print("prompting: plain continuation of the raw prompt (no chat template, no thinking)")
        res = run_decode_bench(tgt, drafters, sets, _ints(budgets), [float(t) for t in temperatures.split(",")],
                               max_new_tokens, repeats, out,
                               log=lambda m: console.print(m, markup=False, highlight=False), ngram=ngram)
    except (BenchError, DecodeError, DrafterError, TargetError) as e:
        _fail(e)
    md = markdown_table(res)
    atomic_write_text(out / "table.md", md)
    plots = decode_plots(res, out)
    console.print(md, markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {out / 'results.json'}, {out / 'table.md'}, " + ", ".join(str(p) for p in plots))


@app.command()
def serve(
    baseline_url: str = typer.Option(..., help="OpenAI-compatible base URL of the plain server (…/v1)."),
    speculative_url: Optional[str] = typer.Option(None, help="Base URL of the speculative server (…/v1)."),
    prompts: str = typer.Option("humaneval", help="'humaneval' or a JSONL file with 'prompt'."),
    num_prompts: int = typer.Option(32, help="Requests per concurrency level."),
    max_tokens: int = typer.Option(128, help="Output tokens per request (fixed with ignore_eos)."),
    concurrency: str = typer.Option("1,2,4,8,16,32"),
    ignore_eos: bool = typer.Option(True, help="Send ignore_eos (vLLM) so every output has max_tokens."),
    target: str = typer.Option("TARGET", help="Only for the printed vLLM commands."),
    drafter: Optional[str] = typer.Option(None, help="Only for the printed vLLM commands."),
    block_size: int = typer.Option(16, help="Drafter block size B (num_speculative_tokens = B-1)."),
    timeout_s: float = typer.Option(300.0),
    out: Path = typer.Option(Path("runs/bench_serve"), "-o", "--out"),
) -> None:
    """Concurrency sweep: throughput, TTFT, TPOT (percentiles), per-level speedup, spec-decode acceptance."""
    from flashdraft.bench.decode_bench import BenchError, load_prompt_set
    from flashdraft.bench.plots import serve_plots
    from flashdraft.bench.serve_bench import ServeBenchError, run_serve_bench, serve_table, vllm_commands
    from flashdraft.io import atomic_write_text

    console.print("servers a user would start (baseline, speculative):")
    for c in vllm_commands(target, drafter, block_size):
        console.print("  " + c, markup=False, highlight=False)
    endpoints = {"baseline": baseline_url} | ({"speculative": speculative_url} if speculative_url else {})
    try:
        _, texts = load_prompt_set(prompts)
        texts = (texts * num_prompts)[:num_prompts]
        res = run_serve_bench(endpoints, texts, max_tokens, _ints(concurrency), out, ignore_eos, timeout_s,
                              log=lambda m: console.print(m, markup=False, highlight=False))
    except (BenchError, ServeBenchError) as e:
        _fail(e)
    md = serve_table(res)
    atomic_write_text(out / "serve_table.md", md)
    plots = serve_plots(res, out)
    console.print(md, markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {out / 'serve_results.json'}, {out / 'serve_table.md'}, {plots[0]}")


@app.command()
def model(
    input: Optional[Path] = typer.Option(None, "--input", help="Cost-model input YAML/JSON (CostModelInput)."),
    preset: Optional[str] = typer.Option(None, help="kimi-k2-pcie8 | h200-dense8b (assumed example inputs)."),
    profile: bool = typer.Option(False, "--profile", help="Measure costs on this machine (target + drafter)."),
    target: str = typer.Option("gemma-3-270m", help="--profile: target spec."),
    drafter: Optional[Path] = typer.Option(None, help="--profile: drafter folder (its pass is timed)."),
    decode_results: Optional[Path] = typer.Option(None, help="results.json of `bench decode`: acceptance + validation."),
    tp: Optional[int] = typer.Option(None), gpus: Optional[int] = typer.Option(None),
    interconnect: Optional[str] = typer.Option(None, help="pcie | nvlink | none"),
    latency_us: Optional[float] = typer.Option(None), bandwidth_gbps: Optional[float] = typer.Option(None),
    concurrency: Optional[str] = typer.Option(None), budgets: Optional[str] = typer.Option(None),
    profile_sizes: str = typer.Option("1,2,4,8,16,32,64,129", help="--profile: tokens per timed forward."),
    profile_repeats: int = typer.Option(5, help="--profile: timed runs per size (median; 1 warm-up)."),
    threads: int = typer.Option(1),
    out: Path = typer.Option(Path("runs/bench_model"), "-o", "--out"),
) -> None:
    """Predict speedup vs concurrency for chain and tree per budget; validate against `bench decode` at batch 1."""
    from flashdraft.bench.modelcmd import ModelCmdError, run_model_command

    try:
        run_model_command(input=input, preset=preset, profile=profile, target=target, drafter=drafter,
                          decode_results=decode_results, hardware=dict(tp=tp, gpus=gpus, interconnect=interconnect,
                          latency_us=latency_us, bandwidth_gbps=bandwidth_gbps),
                          concurrency=_ints(concurrency) if concurrency else None,
                          budgets=_ints(budgets) if budgets else None, threads=threads, out=out, console=console,
                          profile_opts=dict(sizes=_ints(profile_sizes), repeats=profile_repeats))
    except ModelCmdError as e:
        _fail(e)


if __name__ == "__main__":
    app()
