"""The demo report's own plots (the decode plots come from :mod:`flashdraft.bench.plots`).

Per-position acceptance, training loss, and the cost model's speedup-vs-concurrency curves for the
same 8-GPU box joined by PCIe and by NVLink, fed with the acceptance this run measured.
"""

from __future__ import annotations

import json
from pathlib import Path

from flashdraft.bench.costmodel import Acceptance, CostModel, Hardware, preset_kimi_k2_pcie8
from flashdraft.bench.plots import _save, plt

BOXES = {"PCIe": "pcie", "NVLink": "nvlink"}


def _rows(bench: dict) -> dict:
    return next(iter(bench["sets"].values()))


def acceptance_plot(bench: dict, out_dir: Path) -> Path:
    """Share of verify rounds that accept draft position k, per drafter: DFlash and every DDTree budget."""
    rows = _rows(bench)
    fig, ax = plt.subplots(figsize=(7, 4))
    for v, s in rows.items():
        if "/dflash" in v or "/ddtree@" in v:
            acc = s["per_position_acceptance"]
            ax.plot(range(1, len(acc) + 1), acc, "o-" if "/dflash" in v else "s--", label=v)
    ax.set(xlabel="draft position k", ylabel="rounds accepting position k", ylim=(0, 1.02),
           title=f"per-position acceptance ({next(iter(bench['sets']))})")
    ax.legend(fontsize=7)
    return _save(fig, Path(out_dir) / "acceptance.png")


def loss_plot(metrics: Path, out_dir: Path) -> Path | None:
    """Training loss per logged step (metrics.jsonl 'train' lines); None when nothing was logged."""
    pts = []
    for line in Path(metrics).read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "train" and "loss" in rec:
            pts.append((rec["step"], rec["loss"]))
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([s for s, _ in pts], [v for _, v in pts], "-")
    ax.set(xlabel="optimizer step", ylabel="loss", title="training loss (this run)")
    return _save(fig, Path(out_dir) / "loss.png")


def measured_acceptance(bench: dict, drafter: str) -> Acceptance:
    """The cost model's acceptance from this run: chain tau from DFlash's per-position acceptance, tree tau
    and the LM-head spine rows from each DDTree budget."""
    rows = _rows(bench)
    acc = rows[f"{drafter}/dflash"]["per_position_acceptance"]
    tree = {b: rows[f"{drafter}/ddtree@{b}"] for b in bench["budgets"] if f"{drafter}/ddtree@{b}" in rows}
    return Acceptance(chain_tau={g: 1 + sum(acc[:g]) for g in range(1, len(acc) + 1)},
                      tree_tau={b: s["tau_mean"] for b, s in tree.items()},
                      tree_spine={b: s["spine_rows_mean"] for b, s in tree.items() if "spine_rows_mean" in s},
                      source=f"measured: {drafter} drafter, {next(iter(bench['sets']))}")


def costmodel_curves(bench: dict) -> dict:
    """Predictions of the 8-GPU PCIe preset and the same box on NVLink, for the drafter whose largest-budget
    DDTree accepted the most (acceptance measured in this run)."""
    rows = _rows(bench)
    top = max(bench["budgets"])
    drafter = max(bench["drafters"], key=lambda d: rows.get(f"{d}/ddtree@{top}", {}).get("tau_mean", 0.0))
    acc = measured_acceptance(bench, drafter)
    block = bench["drafters"][drafter]["block_size"]
    boxes = {}
    for name, link in BOXES.items():
        base = preset_kimi_k2_pcie8()
        inp = base.model_copy(update=dict(hardware=Hardware(gpus=base.hardware.gpus, tp=base.hardware.tp, interconnect=link),
                                          acceptance=acc, block_size=block, budgets=list(bench["budgets"])))
        boxes[name] = CostModel(inp).predict()
    return dict(drafter=drafter, target=base.target.name, boxes=boxes,
                source=f"preset kimi-k2-pcie8 hardware, interconnect PCIe vs NVLink; acceptance {acc.source}")


def costmodel_plot(curves: dict, out_dir: Path) -> Path:
    """Best predicted speedup per concurrency, chain (DFlash) and tree (DDTree), one colour per interconnect."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (box, pred) in enumerate(curves["boxes"].items()):
        conc = sorted({r["concurrency"] for r in pred["rows"]})
        for m, style in (("dflash", "o--"), ("ddtree", "s-")):
            best = [max((r["speedup"] for r in pred["rows"] if r["concurrency"] == c and r["method"] == m), default=None)
                    for c in conc]
            if None in best:  # no acceptance measured for this method
                continue
            ax.plot(conc, best, style, c=f"C{i}", label=f"{box}: {m} (best budget)")
    ax.axhline(1.0, c="k", lw=0.5)
    ax.set(xscale="log", xlabel="concurrent requests", ylabel="predicted speedup over AR",
           title=f"cost model: {curves['target']}, 8 GPUs TP=8")
    ax.legend(fontsize=7)
    return _save(fig, Path(out_dir) / "costmodel.png")
