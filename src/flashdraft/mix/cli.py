"""`flashdraft mix report | plan | rebalance` (a typer sub-app; the main CLI mounts it as ``mix``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from flashdraft.errors import exit_on_error
from flashdraft.io import atomic_write_text, check_not_input, check_output_dir
from flashdraft.mix.config import MixConfig
from flashdraft.mix.domains import MixError, format_mix, parse_mix
from flashdraft.mix.methods import make_classifier

app = typer.Typer(help="Measure a data set's domain mix (report), plan new prompt sources to reach a target mix "
                       "(plan), and write a training set at that mix (rebalance).", no_args_is_help=True,
                  pretty_exceptions_enable=False)

CONFIG = typer.Option(None, "--config", help="YAML file with a `mix` config (flags override it)")
LABELS = typer.Option(None, "--labels", help="comma-separated domain label set (default: the 7 built-in domains)")
METHOD = typer.Option(None, "--method", help="classifier: learned (default), rules or embedding")
MODEL = typer.Option(None, "--model", help="head file: a learned head (default: the shipped one) or an embedding head")
WORKERS = typer.Option(None, "--workers", help="processes that classify (default 1)")
SET = typer.Option(None, "--set", help="any mix config field: --set key=value (repeatable; flags override it)")


def _config(config: Optional[Path], sets: Optional[list[str]], labels: Optional[str], method: Optional[str],
            model: Optional[str], workers: Optional[int], **more) -> MixConfig:
    return MixConfig.load(config, sets=sets, labels=labels.split(",") if labels else None, method=method,
                          model=model, workers=workers, **more)


def _classifier(cfg: MixConfig):
    return make_classifier(cfg.method, cfg.labels, cfg.keyword_labels, cfg.model, cfg.abstain_below)


def _composition_counts(path: Path, cfg: MixConfig, clf) -> tuple[dict[str, int], int]:
    """Domain counts of ``path``: a report.json from `mix report`, or data that is classified now."""
    from flashdraft.mix.report import compose_path

    if path.is_file() and path.suffix == ".json":
        try:
            rep = json.loads(path.read_text())
            counts = {d: int(v["count"]) for d, v in rep["domains"].items()}
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise MixError(f"{path} is not a report.json written by `flashdraft mix report` ({e}); pass the data "
                           "itself or that report") from None
        return counts, sum(counts.values())
    comp = compose_path(path, clf, examples=0, batch_size=cfg.batch_size, source_field=cfg.source_field,
                        workers=cfg.workers)
    return comp.counts(), comp.total


@app.command()
def report(
    data: Path = typer.Argument(..., help="JSONL/Parquet file, a folder of them, or a datasets.save_to_disk folder"),
    out: Path = typer.Option(Path("mix_report"), "--out", help="folder for report.md, report.json, mix.png, "
                                                                "examples.jsonl"),
    examples: Optional[int] = typer.Option(None, "--examples", help="random examples per domain (default 5)"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    chart: bool = typer.Option(True, "--chart/--no-chart", help="write the bar chart PNG"),
    config: Optional[Path] = CONFIG, labels: Optional[str] = LABELS, method: Optional[str] = METHOD,
    model: Optional[str] = MODEL, workers: Optional[int] = WORKERS, set_: Optional[list[str]] = SET,
) -> None:
    """Composition per domain and per source (count, share, tokens, mean response length), a bar chart and
    random examples per domain to check by hand."""
    from flashdraft.mix.report import compose_path, write_report

    with exit_on_error():
        cfg = _config(config, set_, labels, method, model, workers, examples=examples, seed=seed)
        check_not_input(out, [data])
        check_output_dir(out)  # before classifying: a bad --out is named at once
        comp = compose_path(data, _classifier(cfg), cfg.examples, cfg.seed, cfg.batch_size, cfg.source_field,
                            cfg.workers)
        paths = write_report(comp, out, data.name, chart=chart)
    typer.echo(f"{comp.total:,} samples: {format_mix(comp.shares())}")
    q = comp.quality or {}  # (to_json would redo the bootstrap of the corrected shares)
    if q.get("loro_accuracy") is not None:
        lo, hi = (q.get("loro_interval") or {}).get("accuracy") or (float("nan"), float("nan"))
        typer.echo(f"classifier {q['method']}: leave-one-family-out accuracy {q['lofo_accuracy']:.3f}, "
                   f"leave-one-repository-out {q['loro_accuracy']:.3f} (95% {lo:.2f}-{hi:.2f}; "
                   "the figure for sources the pool never saw)")
    for kind, p in paths.items():
        typer.echo(f"{kind}: {p}")


@app.command()
def plan(
    current: Path = typer.Argument(..., help="the current data, or its report.json from `mix report`"),
    target: str = typer.Option(..., "--target", help="target mix, e.g. coding=0.46,general=0.26,math=0.11,agent=0.09,"
                                                     "tool_calling=0.05,other=0.03"),
    total: int = typer.Option(..., "--total", help="size of the final data set, in samples"),
    candidate: list[str] = typer.Option([], "--candidate", help="NAME=PATH[@AVAILABLE]: a candidate prompt source "
                                        "(data or its report.json); AVAILABLE caps the prompts it can give "
                                        "(default: its size). Repeat for each source."),
    allow_downsample: bool = typer.Option(False, "--allow-downsample", help="let the plan drop current samples"),
    prompts_per_hour: Optional[float] = typer.Option(None, "--prompts-per-hour", help="measured regeneration "
                                                     "throughput, prompts per GPU-hour"),
    gpu_hours_per_600k: Optional[float] = typer.Option(None, "--gpu-hours-per-600k", help="measured GPU-hours per "
                                                       "600K regenerated prompts"),
    out: Optional[Path] = typer.Option(None, "--out", help="write the markdown plan here (default: print it)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="also write the plan as JSON here (prompts to take "
                                            "per source, expected counts per domain, shortfalls) for scripts"),
    tolerance: Optional[float] = typer.Option(None, "--tolerance", help="allowed deviation per domain (0.01 = 1 pp)"),
    config: Optional[Path] = CONFIG, labels: Optional[str] = LABELS, method: Optional[str] = METHOD,
    model: Optional[str] = MODEL, workers: Optional[int] = WORKERS, set_: Optional[list[str]] = SET,
) -> None:
    """How many prompts to take from each candidate source to land on the target mix (linear program), the
    expected mix, and the regeneration time from a measured throughput."""
    from flashdraft.mix.plan import Candidate, hours_for, render_plan, solve_plan

    with exit_on_error():
        cfg = _config(config, set_, labels, method, model, workers, tolerance=tolerance)
        clf = _classifier(cfg)
        shares = parse_mix(target, cfg.labels)
        if not candidate:
            raise MixError("no --candidate given; add at least one NAME=PATH[@AVAILABLE] prompt source")
        cur_counts, _ = _composition_counts(current, cfg, clf)
        cands = []
        for spec in candidate:
            if "=" not in spec:
                raise MixError(f"cannot read --candidate {spec!r}; write it as NAME=PATH or NAME=PATH@AVAILABLE")
            name, rest = spec.split("=", 1)
            path_s, _, avail_s = rest.partition("@")
            counts, n = _composition_counts(Path(path_s), cfg, clf)
            if n == 0:
                raise MixError(f"candidate {name!r} ({path_s}) holds no samples")
            try:
                available = int(float(avail_s)) if avail_s else n
            except ValueError:
                raise MixError(f"--candidate {spec!r}: {avail_s!r} after @ must be a number of prompts") from None
            cands.append(Candidate(name.strip(), {d: c / n for d, c in counts.items()}, available))
        hours = hours_for(0, prompts_per_hour, gpu_hours_per_600k)  # validates the flags early
        result = solve_plan(cur_counts, cands, shares, total, allow_downsample, cfg.tolerance)
        hours = hours_for(result.new_prompts, prompts_per_hour, gpu_hours_per_600k)
        note = (f" ({prompts_per_hour:,.0f} prompts/GPU-hour)" if prompts_per_hour else
                f" ({gpu_hours_per_600k:g} GPU-hours per 600K prompts)" if gpu_hours_per_600k else "")
        text = render_plan(result, cands, hours, note)
        if json_out:
            atomic_write_text(json_out, json.dumps(result.to_json(), indent=2) + "\n")
    if out:
        atomic_write_text(out, text)
        typer.echo(f"plan: {out}")
    typer.echo(text if not out else f"expected mix: {format_mix(result.expected_shares())}")
    if result.short:
        typer.echo(f"short of target: {', '.join(result.short)}", err=True)


@app.command()
def rebalance(
    data: Path = typer.Argument(..., help="the data to draw from (any layout `mix report` reads)"),
    target: str = typer.Option(..., "--target", help="target mix, e.g. coding=0.5,general=0.3,math=0.2"),
    out: Path = typer.Option(..., "--out", help="output file, .jsonl or .parquet (written atomically)"),
    total: Optional[int] = typer.Option(None, "--total", help="rows to write (default: the most the data allows)"),
    max_repeat: int = typer.Option(1, "--max-repeat", help="most copies of one row (1 = down-sampling only)"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    config: Optional[Path] = CONFIG, labels: Optional[str] = LABELS, method: Optional[str] = METHOD,
    model: Optional[str] = MODEL, workers: Optional[int] = WORKERS, set_: Optional[list[str]] = SET,
) -> None:
    """Write a training set at exactly the target mix (down-sampling, or up-sampling up to --max-repeat copies),
    reproducible by --seed; prints the achieved mix."""
    from flashdraft.mix.rebalance import rebalance as run

    with exit_on_error():
        cfg = _config(config, set_, labels, method, model, workers, seed=seed)
        shares = parse_mix(target, cfg.labels)
        res = run(data, out, _classifier(cfg), shares, total, max_repeat, cfg.seed, batch_size=cfg.batch_size,
                  workers=cfg.workers)
    typer.echo(f"wrote {res.total:,} rows to {res.path}")
    typer.echo("| domain | available | written | share | target |")
    typer.echo("|---|---:|---:|---:|---:|")
    for d, n in res.written.items():
        typer.echo(f"| {d} | {res.available[d]:,} | {n:,} | {res.shares()[d] * 100:.2f}% | {shares[d] * 100:.2f}% |")


@app.command("train-embed")
def train_embed(
    labeled: Path = typer.Argument(..., help="labeled JSONL/Parquet: any sample layout plus a `label` field"),
    out: Path = typer.Option(..., "--out", help="where to save the trained head (.npz)"),
    label_field: str = typer.Option("label", "--label-field"),
) -> None:
    """Train the optional embedding classifier's head (all-MiniLM-L6-v2 embeddings + softmax) on labeled data;
    use it with --method embedding --model OUT."""
    from flashdraft.mix.embed import EmbeddingClassifier
    from flashdraft.mix.records import iter_rows, to_sample

    with exit_on_error():
        samples, gold = [], []
        for rows in iter_rows(labeled):
            for row in rows:
                if not row.get(label_field):
                    raise MixError(f"a row of {labeled} has no {label_field!r} field; label every row")
                samples.append(to_sample(row, labeled.stem, len(samples)))
                gold.append(str(row[label_field]))
        clf = EmbeddingClassifier.train(samples, gold)
        clf.save(out)
    typer.echo(f"trained on {len(samples):,} samples, labels {list(clf.labels)}; head: {out}")
