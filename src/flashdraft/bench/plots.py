"""PNG plots for the bench verbs (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _budget_rows(rows: dict, drafter: str, kind: str) -> list[tuple[int, dict]]:
    pre = f"{drafter}/{kind}@"
    return sorted((int(v[len(pre):]), s) for v, s in rows.items()  # "@16+cost" rows are in the tables only
                  if v.startswith(pre) and v[len(pre):].isdigit())


def decode_plots(results: dict, out_dir: Path) -> list[Path]:
    """Per set and drafter: tau histogram (its chain and each tree budget), speedup and tau vs budget.
    The chain and tree rows are the ones the drafter's family names (DFlash: dflash, ddtree@b)."""
    paths = []
    for key, rows in results["sets"].items():
        safe = key.replace("/", "_").replace("=", "")
        for drafter, info in results["drafters"].items():
            fname = drafter.replace("=", "-")  # "G+hints=none" -> file name G+hints-none
            chain_m, tree_m = info.get("chain", "dflash"), info.get("tree", "ddtree")
            fig, ax = plt.subplots(figsize=(7, 4))
            series = [(f"{drafter}/{chain_m}", rows.get(f"{drafter}/{chain_m}"))]
            series += [(f"{tree_m}@{b}", s) for b, s in _budget_rows(rows, drafter, tree_m)]
            width = 0.8 / max(len(series), 1)
            for j, (name, s) in enumerate(series):
                if not s:
                    continue
                total = max(sum(s["tau_histogram"].values()), 1)
                xs = [int(k) + j * width for k in s["tau_histogram"]]
                ax.bar(xs, [v / total for v in s["tau_histogram"].values()], width=width, label=name)
            ax.set(xlabel="tau (tokens per verify round)", ylabel="share of rounds", title=f"tau histogram: {key}")
            ax.legend(fontsize=7)
            paths.append(_save(fig, Path(out_dir) / f"tau_hist_{safe}_{fname}.png"))

            tree, chain = _budget_rows(rows, drafter, tree_m), _budget_rows(rows, drafter, "chain")
            if not tree:
                continue
            fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
            for name, pts in ((tree_m, tree), ("chain control", chain)):
                if not pts:
                    continue
                a1.plot([b for b, _ in pts], [s["speedup"] for _, s in pts], "o-", label=name)
                a2.plot([b for b, _ in pts], [s["tau_mean"] for _, s in pts], "o-", label=name)
            d = rows.get(f"{drafter}/{chain_m}")
            if d:
                a1.axhline(d["speedup"], ls="--", c="gray", label=f"{chain_m} (full chain)")
                a2.axhline(d["tau_mean"], ls="--", c="gray", label=f"{chain_m} (full chain)")
            a1.axhline(1.0, c="k", lw=0.5)
            for a, yl in ((a1, "speedup over AR (same run)"), (a2, "tau")):
                a.set_xscale("log", base=2)
                a.set_xticks([b for b, _ in tree], labels=[str(b) for b, _ in tree], minor=False)
                a.minorticks_off()
                a.set(xlabel="tree budget (drafted nodes)", ylabel=yl, title=key)
                a.legend(fontsize=7)
            paths.append(_save(fig, Path(out_dir) / f"budget_{safe}_{fname}.png"))
    return paths


def serve_plots(results: dict, out_dir: Path) -> list[Path]:
    """Throughput, TPOT and speedup vs concurrency for the baseline and speculative endpoints."""
    rows = results["rows"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ep in ("baseline", "speculative"):
        pts = sorted((r["concurrency"], r) for r in rows if r["endpoint"] == ep)
        if not pts:
            continue
        axes[0].plot([c for c, _ in pts], [r["output_tokens_per_s"] for _, r in pts], "o-", label=ep)
        axes[1].plot([c for c, _ in pts], [r["tpot_ms"]["p50"] for _, r in pts], "o-", label=ep)
    sp = sorted((c, s) for c, s in results.get("speedup", {}).items())
    axes[2].plot([int(c) for c, _ in sp], [s for _, s in sp], "o-", c="C2")
    axes[2].axhline(1.0, c="k", lw=0.5)
    for a, yl in zip(axes, ("output tokens/s", "TPOT p50 ms", "speedup (throughput ratio)")):
        a.set(xscale="log", xlabel="concurrency", ylabel=yl)
        a.legend(fontsize=7) if a is not axes[2] else None
    return [_save(fig, Path(out_dir) / "serve.png")]


def model_plots(pred: dict, out_dir: Path) -> list[Path]:
    """Predicted speedup vs budget (per concurrency) and best speedup vs concurrency (chain vs tree)."""
    rows = pred["rows"]
    conc = sorted({r["concurrency"] for r in rows})
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for c in conc:
        tree = sorted((r["budget"], r) for r in rows if r["concurrency"] == c and r["method"] == "ddtree")
        if tree:
            a1.plot([b for b, _ in tree], [r["speedup"] for _, r in tree], "o-", label=f"ddtree c={c}")
    tree1 = sorted((r["budget"], r["tau"]) for r in rows if r["concurrency"] == conc[0] and r["method"] == "ddtree")
    if tree1:
        ax2 = a1.twinx()
        ax2.plot([b for b, _ in tree1], [t for _, t in tree1], "k:", label="tau (tree)")
        ax2.set_ylabel("tau (dotted)")
    a1.axhline(1.0, c="k", lw=0.5)
    a1.set(xscale="log", xlabel="tree budget", ylabel="predicted speedup", title="DDTree: speedup vs budget")
    a1.legend(fontsize=6)
    for m in ("dflash", "ddtree"):
        best = [max((r["speedup"] for r in rows if r["concurrency"] == c and r["method"] == m), default=None) for c in conc]
        a2.plot(conc, best, "o-", label=f"{m} (best budget)")
    a2.axhline(1.0, c="k", lw=0.5)
    a2.set(xscale="log", xlabel="concurrency", ylabel="predicted speedup", title="speedup vs concurrency")
    a2.legend(fontsize=7)
    return [_save(fig, Path(out_dir) / "model.png")]
