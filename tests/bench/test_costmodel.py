"""The cost model: all-reduce and roofline terms, the published budget-curve shape, the PCIe TP=8 preset."""

from __future__ import annotations

import pytest

from flashdraft.bench.costmodel import (
    Acceptance, CostModel, CostModelInput, Hardware, MeasuredCosts, ModelTarget, Roofline, interp,
    preset_h200_dense8b, preset_kimi_k2_pcie8,
)
from flashdraft.config import ConfigError


def test_ring_allreduce_formula():
    hw = Hardware(gpus=8, tp=8, interconnect="pcie", latency_us=20.0, bandwidth_gbps=10.0)
    nbytes = 1_000_000
    assert hw.allreduce_ms(nbytes) == pytest.approx(0.020 + 2 * 7 / 8 * nbytes / 10e9 * 1e3)
    assert Hardware(gpus=8, tp=1, interconnect="pcie").allreduce_ms(nbytes) == 0.0
    with pytest.raises(ValueError, match="tp=4 exceeds gpus=2"):
        Hardware(gpus=2, tp=4)


def test_roofline_flat_below_ridge_linear_above():
    r = Roofline(mem_bw_tbps=4.8, peak_tflops=989, dense_params_b=8.2, efficiency=1.0)
    ridge = 989 / 4.8  # flops per byte at bf16 (2 flops per param-token, 2 bytes per param)
    assert r.body(1) == pytest.approx(r.body(ridge * 0.5))
    assert r.body(4 * ridge) == pytest.approx(2 * r.body(2 * ridge))


def test_interp_extrapolates_linearly():
    pts = {1: 10.0, 16: 25.0}
    assert interp(pts, 8) == pytest.approx(10 + 15 * 7 / 15)
    assert interp(pts, 31) == pytest.approx(40.0)
    assert interp(pts, 0.5) == 10.0


def test_dense_h200_tree_peaks_at_intermediate_budget_while_tau_rises():
    pred = CostModel(preset_h200_dense8b()).predict()
    tree = sorted((r["budget"], r) for r in pred["rows"] if r["concurrency"] == 1 and r["method"] == "ddtree")
    taus = [r["tau"] for _, r in tree]
    speed = [r["speedup"] for _, r in tree]
    assert taus == sorted(taus) and taus[-1] > taus[0]  # tau keeps rising with the budget
    peak = speed.index(max(speed))
    assert 0 < peak < len(speed) - 1  # ... but the speedup peaks in between
    best = {b["concurrency"]: b["budget"] for b in pred["best"]}
    assert best[32] < best[1]  # the best budget shrinks with concurrency


def test_pcie_tp8_moe_preset_tree_pays_inversely_to_communication_cost():
    inp = preset_kimi_k2_pcie8()
    pcie = CostModel(inp).predict()
    nv = CostModel(inp.model_copy(update={"hardware": Hardware(gpus=8, tp=8, interconnect="nvlink")})).predict()
    best = lambda pred, c: next(b for b in pred["best"] if b["concurrency"] == c)  # noqa: E731
    c = max(inp.concurrency)
    # at high concurrency the all-reduce of bs x (B + 1) tokens dominates on PCIe: less gain, smaller trees
    assert best(nv, c)["speedup"] > best(pcie, c)["speedup"]
    assert best(pcie, c)["budget"] <= best(nv, c)["budget"]
    big = lambda pred: next(r for r in pred["rows"] if r["concurrency"] == c and r["method"] == "ddtree"  # noqa: E731
                            and r["budget"] == 64)["speedup"]
    assert big(pcie) < 1.0 < big(nv)


def test_speculation_stops_paying_when_verify_is_compute_bound():
    inp = CostModelInput(
        target=ModelTarget(layers=2, hidden=8),
        measured=MeasuredCosts(body_ms={1: 1.0, 8: 8.0}, draft_ms=0.5, draft_block=8),  # linear: no free tokens
        acceptance=Acceptance(chain_tau={3: 2.0}, tree_tau={4: 2.2}), block_size=8, budgets=[3, 4], concurrency=[1, 4])
    pred = CostModel(inp).predict()
    assert pred["stops_paying_at"] == 1
    assert all(b["method"] == "ar" for b in pred["best"])


def test_input_needs_exactly_one_cost_source(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("target: {layers: 2, hidden: 8}\nacceptance: {chain_tau: {1: 1.5}}\n")
    with pytest.raises(ConfigError, match="exactly one of `measured`"):
        CostModelInput.load(p)
    p.write_text("target: {layers: 2, hidden: 8}\nacceptance: {chain_tau: {1: 1.5}}\n"
                 "measured: {body_ms: {1: 2.0, 4: 2.5}}\n")
    assert CostModelInput.load(p).measured.body(2) == pytest.approx(2 + 0.5 / 3)
