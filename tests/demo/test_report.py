"""The demo report from real runs on a tiny target: figures match the result files; it renders in Chromium."""

from __future__ import annotations

import json
import re

import pytest

from flashdraft.bench.decode_bench import run_decode_bench
from flashdraft.demo.pipeline import DemoConfig, machine, stage_mix, stage_prompts
from flashdraft.demo.report import headline, write_report
from flashdraft.demo.stages import write_marker
from flashdraft.models.dflash import DFlashDrafter
from tests.demo.chromium import inspect
from tests.tiny import MASK_ID, OracleDrafter, random_prompts, tiny_target

BUDGETS = [4, 16]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A demo run folder whose bench stage ran for real: tiny target, a random drafter and an oracle drafter."""
    out = tmp_path_factory.mktemp("demo")
    cfg = DemoConfig(out=str(out), prompts=4)
    ctx = {"out": out, "outputs": {}}
    for name, fn in (("prompts", stage_prompts),):
        write_marker(out, name, fn(cfg, ctx), 0.01)
    data = out / "generated.jsonl"  # stands in for the generate stage's records
    data.write_text("".join(json.dumps({"prompt": p, "response": r}) + "\n" for p, r in (
        ("def add(a, b):", "    return a + b"), ("Translate to French: cat", "chat"), ("What is 2 + 3?", "5"))))
    ctx["outputs"]["generate"] = {"data": str(data)}
    write_marker(out, "mix", stage_mix(cfg, ctx), 0.01)
    target = tiny_target("qwen3")
    drafters = {"shipped": DFlashDrafter.for_target(target, num_layers=1, block_size=8, mask_token_id=MASK_ID, seed=3),
                "trained": OracleDrafter(target, block_size=8)}
    res = run_decode_bench(target, drafters, {"humaneval": random_prompts(2, 10)}, BUDGETS, [0.0], 12, 1,
                           out / "bench", log=lambda m: None, ngram=True, lookup=dict(lookup_min=cfg.lookup_min),
                           sizings=list(cfg.sizings))  # the demo's own bench rows
    (out / "bench" / "machine.json").write_text(json.dumps(machine()))
    write_marker(out, "bench", {"results": str(out / "bench" / "results.json"),
                                "machine": str(out / "bench" / "machine.json")}, 0.02)
    return out, cfg, res, write_report(out, cfg)


def test_report_figures_come_from_the_results(run_dir):
    out, cfg, res, paths = run_dir
    md = paths["markdown"].read_text()
    rows = res["sets"]["humaneval@T=0"]
    h = headline(res)
    assert h["lossless"] and h["prompts"] == 2
    assert h["drafters"]["trained"]["best_speedup"] == max(s["speedup"] for v, s in rows.items() if v.startswith("trained/"))
    # the verdict follows the measured speedups, either way
    beat = any(s["speedup"] > 1.0 for v, s in rows.items() if v != "ar")
    assert ("Speculation beat autoregressive" in md) == beat
    assert ("did NOT beat" in md) == (not beat)
    assert "token-identical to AR" in md
    assert f"AR TPOT {rows['ar']['tpot_ms']:.1f} ms" in md
    # the oracle accepts everything (tau = block), the random drafter almost nothing
    assert f"| dflash | {rows['shipped/dflash']['tau_mean']:.2f} |" in md
    assert rows["trained/dflash"]["tau_mean"] == pytest.approx(5.5)  # rounds of 8 and 3: 12 tokens, 1 from the prefill
    for b in BUDGETS:  # every drafter row the bench ran has its line, the hybrid and cost-sized trees included
        for kind in (f"ddtree@{b}", f"chain@{b}", f"ddtree_ngram@{b}", f"ddtree@{b}+cost", f"ddtree_ngram@{b}+cost"):
            assert f"| {kind} |" in md, kind
    trained = h["drafters"]["trained"]
    assert trained["best_hybrid"].startswith("trained/ddtree_ngram@")
    assert f"best hybrid tree (DDTree + prompt lookup) {trained['best_hybrid']} at {trained['hybrid_speedup']:.2f}x" in md
    assert h["fastest_speedup"] == max(s["speedup"] for v, s in rows.items() if v != "ar")
    assert "torchrun --nproc-per-node 8 -m flashdraft.cli train" in md and "--data-parallel 8" in md
    summary = json.loads(paths["summary"].read_text())
    assert set(summary["costmodel"]) == {"PCIe", "NVLink"}
    pcie, nvl = ([b["best_speculative"]["speedup"] for b in summary["costmodel"][k]] for k in ("PCIe", "NVLink"))
    assert len(pcie) == len(nvl) == 6 and pcie != nvl  # the interconnect changes the prediction
    for name in re.findall(r"\]\(figures/([^)]+)\)", md):
        assert (paths["markdown"].parent / "figures" / name).stat().st_size > 1000


def test_report_renders_in_chromium(run_dir, tmp_path):
    _, _, _, paths = run_dir
    page = paths["html"].read_text()
    assert "<img" in page and 'src="figures/' not in page and "http://" not in page and "https://" not in page
    n_img = page.count("<img ")
    shot = tmp_path / "report.png"
    got = inspect(paths["html"], screenshot=shot)
    assert got["errors"] == []
    assert len(got["images"]) == n_img >= 6  # tau x2, budget x2, acceptance, cost model, mix chart
    for img in got["images"]:
        assert img["complete"] and img["w"] > 0 and img["h"] > 0, img
    assert 100_000 < got["bytes"] < 3_000_000  # the inlined PNGs, nothing else heavy
    assert got["size"]["w"] <= 1200 and 1500 < got["size"]["h"] < 20_000  # no horizontal overflow
    assert shot.stat().st_size > 10_000


def test_chromium_check_catches_a_broken_page(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><img alt="x" src="data:image/png;base64,AAAA">'
                   '<script>console.error("plot failed")</script></body></html>')
    got = inspect(bad)
    assert got["images"][0]["w"] == 0
    assert got["errors"] == ["console: plot failed"]
