"""`flashdraft mix report`: composition of a data set per domain and per source, streamed.

Memory is bounded by the number of (source, domain) pairs plus ``examples`` samples per domain
(reservoir sampling), never by the number of rows.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from flashdraft.io import atomic_write_bytes, atomic_write_text, make_output_dir
from flashdraft.mix.classify import classify_stream
from flashdraft.mix.domains import MixError
from flashdraft.mix.records import Sample, iter_samples

_TOKEN_PIECE = re.compile(r"\w+|[^\w\s]")


def approx_tokens(text: str) -> int:
    """A tokenizer-free token estimate: words and punctuation marks (used when rows carry no token_ids)."""
    return len(_TOKEN_PIECE.findall(text))


@dataclass
class Tally:
    """Running totals of one group of samples."""

    count: int = 0
    tokens: int = 0
    response_tokens: int = 0
    response_chars: int = 0

    def add(self, s: Sample) -> None:
        self.count += 1
        if s.n_tokens is not None:
            self.tokens += s.n_tokens
            resp = s.n_response_tokens if s.n_response_tokens is not None else approx_tokens(s.response)
        else:
            resp = approx_tokens(s.response)
            self.tokens += approx_tokens(s.prompt) + resp
        self.response_tokens += resp
        self.response_chars += len(s.response)

    def as_dict(self, total: int) -> dict:
        return {"count": self.count, "share": self.count / total if total else 0.0, "tokens": self.tokens,
                "mean_response_tokens": self.response_tokens / self.count if self.count else 0.0,
                "mean_response_chars": self.response_chars / self.count if self.count else 0.0}


@dataclass
class Composition:
    """Counts per domain and per (source, domain), plus example reservoirs; built by :func:`compose`."""

    labels: tuple[str, ...]
    by_domain: dict[str, Tally] = field(default_factory=dict)
    by_source: dict[str, dict[str, Tally]] = field(default_factory=dict)
    examples: dict[str, list[dict]] = field(default_factory=dict)
    total: int = 0
    unclassifiable: int = 0  # rows with too little text to classify (labelled "other" by the rule too_little_text)
    exact_tokens: bool = True
    method: str = "rules"
    quality: dict | None = None  # the classifier's measured accuracy and confusion (flashdraft.mix.correct)

    def corrected(self) -> dict[str, dict[str, float]]:
        """Shares corrected for the classifier's measured confusion, with 95% intervals ({} if unknown)."""
        if not self.quality or not self.total:
            return {}
        from flashdraft.mix.correct import corrected_shares

        return corrected_shares(self.counts(), self.quality["confusion"])

    def shares(self) -> dict[str, float]:
        """Share of samples per domain (all labels, zeros included)."""
        return {d: (self.by_domain[d].count / self.total if self.total and d in self.by_domain else 0.0)
                for d in self.labels}

    def counts(self) -> dict[str, int]:
        return {d: self.by_domain[d].count if d in self.by_domain else 0 for d in self.labels}

    def to_json(self) -> dict:
        q = {k: v for k, v in (self.quality or {}).items() if k != "confusion"} or None
        return {
            "total": self.total, "unclassifiable": self.unclassifiable, "labels": list(self.labels), "method": self.method,
            "classifier": q, "corrected_shares": self.corrected(),
            "tokens": "token_ids" if self.exact_tokens else "estimated (words + punctuation; rows had no token_ids)",
            "domains": {d: self.by_domain.get(d, Tally()).as_dict(self.total) for d in self.labels},
            "sources": {src: {d: t.as_dict(sum(x.count for x in per.values())) for d, t in per.items()}
                        for src, per in sorted(self.by_source.items())},
        }


def compose(batches: Iterable[list[Sample]], classifier, examples: int = 5, seed: int = 0,
            workers: int = 1) -> Composition:
    """Classify every sample of ``batches`` (in ``workers`` processes) and tally it; keep ``examples``
    random samples per domain."""
    from flashdraft.mix.correct import quality_of

    comp = Composition(labels=tuple(classifier.labels), method=classifier.method, quality=quality_of(classifier))
    rng = random.Random(seed)
    seen: dict[str, int] = {}
    for batch, labels in classify_stream(batches, classifier, workers):
        for s, lab in zip(batch, labels):
            d = lab.domain
            comp.total += 1
            comp.unclassifiable += lab.rule == "too_little_text"
            comp.exact_tokens &= s.n_tokens is not None
            comp.by_domain.setdefault(d, Tally()).add(s)
            comp.by_source.setdefault(s.source, {}).setdefault(d, Tally()).add(s)
            n = seen[d] = seen.get(d, 0) + 1
            keep = comp.examples.setdefault(d, [])
            item = None
            if len(keep) < examples:
                item = len(keep)
                keep.append({})
            elif examples and rng.random() < examples / n:
                item = rng.randrange(examples)
            if item is not None:
                keep[item] = {"source": s.source, "id": s.id, "rule": lab.rule, "signals": lab.signals,
                              "prompt": s.prompt[:1500], "response": s.response[:1500]}
    return comp


def compose_path(path: str | Path, classifier, examples: int = 5, seed: int = 0, batch_size: int = 4096,
                 source_field: str = "source", workers: int = 1) -> Composition:
    """:func:`compose` over a data path; errors if it holds no samples."""
    comp = compose(iter_samples(path, batch_size, source_field), classifier, examples, seed, workers)
    if comp.total == 0:
        raise MixError(f"{path} holds no samples; point at a non-empty JSONL/Parquet file or dataset")
    if comp.unclassifiable == comp.total:
        raise MixError(f"no classifiable rows in {path}: all {comp.total:,} are empty or too short to classify, so "
                       "there are no shares to report; pass data whose rows carry prompt or response text")
    return comp


def bar_chart_png(comp: Composition, path: Path, title: str = "domain mix", target: dict[str, float] | None = None):
    """Write a horizontal bar chart of domain shares (and the target, if given) as PNG (matplotlib Agg)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shares = comp.shares()
    names = list(shares)
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(names) + 1.2), dpi=100)
    ys = range(len(names))
    ax.barh([y + (0.2 if target else 0) for y in ys], [shares[n] * 100 for n in names], height=0.4 if target else 0.6,
            label="current")
    if target:
        ax.barh([y - 0.2 for y in ys], [target.get(n, 0) * 100 for n in names], height=0.4, label="target")
        ax.legend()
    ax.set_yticks(list(ys), names)
    ax.invert_yaxis()
    ax.set_xlabel("% of samples")
    ax.set_title(f"{title} ({comp.total:,} samples)")
    for y, n in zip(ys, names):
        ax.text(shares[n] * 100, y + (0.2 if target else 0), f" {shares[n] * 100:.1f}%", va="center", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def render_markdown(comp: Composition, data_name: str, chart_name: str | None, j: dict | None = None) -> str:
    """The report as markdown: per-domain table, per-source table, examples to check by hand (``j``: the
    composition's :meth:`Composition.to_json`, when the caller has it)."""
    j = j or comp.to_json()
    lines = [f"# Data mix report: {data_name}", "",
             f"{comp.total:,} samples, classifier `{comp.method}`, tokens: {j['tokens']}."
             + (f" {comp.unclassifiable:,} rows were too short to classify (counted as `other`)."
                if comp.unclassifiable else ""), ""]
    if chart_name:
        lines += [f"![domain mix]({chart_name})", ""]
    lines += ["## Per domain", "", "| domain | count | share | tokens | mean response tokens | mean response chars |",
              "|---|---:|---:|---:|---:|---:|"]
    for d, t in j["domains"].items():
        lines.append(f"| {d} | {t['count']:,} | {t['share'] * 100:.1f}% | {t['tokens']:,} | "
                     f"{t['mean_response_tokens']:.1f} | {t['mean_response_chars']:.0f} |")
    lines += _quality_lines(j)
    lines += ["", "## Per source", "", "| source | domain | count | share of source | tokens | mean response tokens |",
              "|---|---|---:|---:|---:|---:|"]
    for src, per in j["sources"].items():
        for d, t in sorted(per.items(), key=lambda kv: -kv[1]["count"]):
            lines.append(f"| {src} | {d} | {t['count']:,} | {t['share'] * 100:.1f}% | {t['tokens']:,} | "
                         f"{t['mean_response_tokens']:.1f} |")
    lines += ["", "## Examples to check by hand", "",
              "Random samples per domain (reservoir sampling) with the rule and signals that decided each label.", ""]
    for d in comp.labels:
        for ex in comp.examples.get(d, []):
            lines += [f"### {d}: {ex['source']} / {ex['id']} (rule `{ex['rule']}`)", "",
                      f"signals: `{json.dumps(ex['signals'], ensure_ascii=False)}`", "",
                      "```text", "PROMPT: " + ex["prompt"][:600].replace("```", "ˋˋˋ"),
                      "RESPONSE: " + ex["response"][:600].replace("```", "ˋˋˋ"), "```", ""]
    return "\n".join(lines) + "\n"


def _quality_lines(j: dict) -> list[str]:
    """The classifier's measured accuracy and the confusion-corrected shares with their intervals."""
    q, cor = j.get("classifier"), j.get("corrected_shares") or {}
    if not q:
        return ["", f"Classifier `{j['method']}`: no measured accuracy is known for it, so the shares above are "
                "uncorrected counts of its labels."]
    held = f"{q['heldout_accuracy']:.3f}" if q.get("heldout_accuracy") is not None else "n/a"
    out = ["", "## How far to trust these shares", "",
           f"Classifier `{q['method']}`: accuracy {held} on the held-out set (`mix/data/eval_set.jsonl`); "
           f"**leave-one-family-out accuracy {q['lofo_accuracy']:.3f}** on {q['rows']} labelled samples from "
           f"{q['families']} families ({q['note']}); recall per domain: "
           + ", ".join(f"{d} {r:.2f}" for d, r in q["lofo_recall"].items()) + ".", *_loro_lines(q), "",
           "A share counted from labels with known confusion is not exact. The corrected share solves "
           "label shares = confusion^T x true shares (non-negative least squares, confusion measured "
           f"{'leave-one-repository-out' if q.get('loro_accuracy') is not None else 'leave-one-family-out'}); "
           "the 95% interval resamples the confusion counts and the label counts "
           "(bootstrap, 400 draws). Domains outside the labelled pool (e.g. `other`) are treated as noise.", "",
           "| domain | labelled share | corrected share | 95% interval |", "|---|---:|---:|---|"]
    for d, v in cor.items():
        out.append(f"| {d} | {v['raw'] * 100:.1f}% | {v['corrected'] * 100:.1f}% | "
                   f"{v['low'] * 100:.1f}% - {v['high'] * 100:.1f}% |")
    return out


def _loro_lines(q: dict) -> list[str]:
    """The leave-one-repository-out figure (a source never seen) with its 95% intervals, where the head has it."""
    if q.get("loro_accuracy") is None:
        return []
    ci = q.get("loro_interval") or {}
    span = lambda v: f" ({v[0]:.2f}-{v[1]:.2f})" if v and None not in v else ""
    return ["", f"**Leave-one-repository-out accuracy {q['loro_accuracy']:.3f}**{span(ci.get('accuracy'))} (every row "
            f"of a repository held out at once, {q.get('repositories')} repositories; 95% intervals resample whole "
            "repositories): the figure for data from a source the pool never saw. Recall per domain: "
            + ", ".join(f"{d} {r:.2f}{span((ci.get('recall') or {}).get(d))}" for d, r in q["loro_recall"].items()) + "."]


def write_report(comp: Composition, out_dir: Path, data_name: str, chart: bool = True) -> dict[str, Path]:
    """Write report.md, report.json, mix.png and examples.jsonl into ``out_dir`` (each atomically)."""
    out_dir = Path(out_dir)
    make_output_dir(out_dir)
    paths = {"markdown": out_dir / "report.md", "json": out_dir / "report.json",
             "examples": out_dir / "examples.jsonl"}
    if chart:
        paths["chart"] = out_dir / "mix.png"
        bar_chart_png(comp, paths["chart"], title=data_name)
    j = comp.to_json()  # once: the corrected shares are a 400-draw bootstrap
    atomic_write_text(paths["json"], json.dumps(j, indent=2))
    atomic_write_text(paths["examples"], "".join(json.dumps({"domain": d, **ex}, ensure_ascii=False) + "\n"
                                                 for d in comp.labels for ex in comp.examples.get(d, [])))
    atomic_write_text(paths["markdown"], render_markdown(comp, data_name, "mix.png" if chart else None, j))
    return paths
