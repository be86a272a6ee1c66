"""The speculative-decoding cost model: predicted speedup vs concurrency for chain (DFlash) and tree (DDTree).

Per verify round of a batch of ``bs`` sequences (reference notes, section C):

    S(bs) = tau * t_AR(bs) / (t_draft(bs) + t_verify(bs * n, head rows) + t_host(bs, nodes) + t_commit)

with n = gamma + 1 for a chain of gamma drafts and B + 1 for a tree of budget B. Under tensor
parallelism of degree p every target forward pays 2 all-reduces per layer, each of
tokens x hidden x 2 bytes, ring time = latency + 2 (p - 1) / p x bytes / bandwidth; the drafter pays
the same for its own layers over bs x block tokens.

Two sources of forward cost: :class:`MeasuredCosts` (profiled on this machine, piecewise-linear in
the number of tokens, linear extrapolation) and :class:`Roofline` (t = max(bytes / memory bandwidth,
flops / peak): flat below the ridge, linear above; MoE weights touched grow with the token count).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flashdraft.config import Section

# interconnect presets: (latency us, all-reduce bandwidth GB/s). PCIe is a least-squares fit of NCCL
# all-reduce times measured on 4xV100 behind a PLX switch (4 KB 19.4 us, 128 KB 51.8 us, 384 KB 83.5 us;
# reference notes C): bandwidth ~9 GB/s, latency ~19 us. NVLink is an ASSUMED round figure (override it).
INTERCONNECTS: dict[str, tuple[float, float]] = {"pcie": (19.0, 9.0), "nvlink": (8.0, 300.0), "none": (0.0, float("inf"))}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def interp(points: dict[int, float], x: float) -> float:
    """Piecewise-linear interpolation over {x: y}; linear extrapolation from the last two points."""
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]] * max(x, 1) / max(xs[0], 1)
    if x <= xs[0]:
        return points[xs[0]]  # flat below the smallest measured size
    for lo, hi in zip(xs, xs[1:]):
        if x <= hi:
            return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)
    lo, hi = xs[-2], xs[-1]
    return points[hi] + (points[hi] - points[lo]) * (x - hi) / (hi - lo)


class Hardware(_Strict):
    """GPUs, tensor-parallel degree and the interconnect (preset values can be overridden)."""

    gpus: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)
    interconnect: Literal["pcie", "nvlink", "none"] = "none"
    latency_us: float | None = Field(None, ge=0, description="all-reduce latency; default from the preset")
    bandwidth_gbps: float | None = Field(None, gt=0, description="all-reduce bus bandwidth GB/s; default from the preset")

    @model_validator(mode="after")
    def _check(self) -> "Hardware":
        if self.tp > self.gpus:
            raise ValueError(f"tp={self.tp} exceeds gpus={self.gpus}; lower tp or raise gpus")
        return self

    def allreduce_ms(self, nbytes: float) -> float:
        """Ring all-reduce of ``nbytes`` over ``tp`` ranks (0 without tensor parallelism)."""
        if self.tp == 1:
            return 0.0
        lat, bw = INTERCONNECTS[self.interconnect]
        lat = self.latency_us if self.latency_us is not None else lat
        bw = self.bandwidth_gbps if self.bandwidth_gbps is not None else bw
        return lat / 1e3 + 2 * (self.tp - 1) / self.tp * nbytes / (bw * 1e9) * 1e3


class MeasuredCosts(_Strict):
    """Costs profiled on real hardware (``bench model --profile``) at batch 1, in milliseconds."""

    body_ms: dict[int, float] = Field(description="target body forward (no LM head) vs tokens in the forward")
    head_ms: dict[int, float] = Field(default_factory=dict, description="LM head vs rows scored (walk scores the spine)")
    draft_ms: float = Field(0.0, ge=0, description="one drafter pass over a block at batch 1")
    draft_block: int = Field(16, ge=1, description="tokens in the drafter pass (block size)")
    tree_build_ms: dict[int, float] = Field(default_factory=dict, description="host tree build + mask vs drafted nodes")
    commit_ms: float = Field(0.0, ge=0, description="KV compaction + bookkeeping per round")
    recurrent_ms: dict[int, float] = Field(
        default_factory=dict,
        description="hybrid targets: part of body_ms spent in the recurrent layers (exact per-node states) vs tree nodes",
    )
    recurrent_state_bytes: int = Field(0, ge=0, description="hybrid targets: recurrent state bytes kept per tree node")

    def body(self, tokens: float) -> float:
        return interp(self.body_ms, tokens)

    def head(self, rows: float) -> float:
        return interp(self.head_ms, rows) if self.head_ms else 0.0

    def recurrent(self, nodes: float) -> float:
        """Recurrent-layer share of the body at ``nodes`` tree nodes (0 for pure-attention targets)."""
        return interp(self.recurrent_ms, nodes) if self.recurrent_ms else 0.0

    def recurrent_per_node(self) -> float:
        """Marginal ms per extra tree node in the recurrent layers (slope over the measured sizes)."""
        if len(self.recurrent_ms) < 2:
            return 0.0
        xs = sorted(self.recurrent_ms)
        return (self.recurrent_ms[xs[-1]] - self.recurrent_ms[xs[0]]) / (xs[-1] - xs[0])

    def draft(self, bs: int) -> float:
        """Drafter time at batch bs: batch-1 time scaled like the target body over bs x block tokens."""
        if self.draft_ms == 0:
            return 0.0
        return self.draft_ms * self.body(bs * self.draft_block) / self.body(self.draft_block)

    def host(self, nodes: int) -> float:
        return interp(self.tree_build_ms, nodes) if self.tree_build_ms else 0.0


class Roofline(_Strict):
    """Roofline forward cost for hardware you cannot measure (per GPU figures; weights split over tp)."""

    mem_bw_tbps: float = Field(gt=0, description="HBM bandwidth per GPU, TB/s")
    peak_tflops: float = Field(gt=0, description="dense matmul peak per GPU, TFLOP/s")
    weight_bytes_per_param: float = Field(2.0, gt=0)
    dense_params_b: float = Field(gt=0, description="params every token uses (attention, dense, shared experts, head), billions")
    expert_params_b: float = Field(0.0, ge=0, description="params of ONE routed expert summed over MoE layers, billions")
    num_experts: int = Field(0, ge=0)
    experts_per_token: int = Field(0, ge=0)
    efficiency: float = Field(0.7, gt=0, le=1, description="achieved fraction of both roofs")
    draft_params_b: float = Field(0.0, ge=0, description="drafter params, billions (dense)")
    draft_block: int = Field(16, ge=1)
    host_ms_base: float = Field(0.3, ge=0, description="per round host time (launch, sync, walk)")
    host_ms_per_node: float = Field(0.002, ge=0, description="per drafted node host time (tree build, mask)")

    def _time_ms(self, params_b_touched: float, active_b: float, tokens: float, tp: int) -> float:
        t_mem = params_b_touched * 1e9 * self.weight_bytes_per_param / (tp * self.mem_bw_tbps * 1e12)
        t_flop = 2 * active_b * 1e9 * tokens / (tp * self.peak_tflops * 1e12)
        return max(t_mem, t_flop) / self.efficiency * 1e3

    def body(self, tokens: float, tp: int = 1) -> float:
        touched = 0.0
        if self.num_experts:
            # expected distinct experts hit by `tokens` tokens routed to k of E each (uniform routing)
            touched = self.num_experts * (1 - (1 - self.experts_per_token / self.num_experts) ** tokens)
        active = self.dense_params_b + self.experts_per_token * self.expert_params_b
        return self._time_ms(self.dense_params_b + touched * self.expert_params_b, active, tokens, tp)

    def draft(self, bs: int, tp: int = 1) -> float:
        if self.draft_params_b == 0:
            return 0.0
        return self._time_ms(self.draft_params_b, self.draft_params_b, bs * self.draft_block, tp)


class Acceptance(_Strict):
    """Acceptance profile: tau per chain length (gamma drafts) and per tree budget, measured or synthetic."""

    chain_tau: dict[int, float] = Field(default_factory=dict, description="gamma -> tau (bonus included)")
    tree_tau: dict[int, float] = Field(default_factory=dict, description="budget -> tau (bonus included)")
    tree_spine: dict[int, float] = Field(default_factory=dict,
                                         description="budget -> mean spine length (LM-head rows); default depth + 1")
    source: str = "given"

    @classmethod
    def from_per_position(cls, acc: list[float], source: str = "per-position acceptance") -> "Acceptance":
        """chain tau(gamma) = 1 + sum of the first gamma per-position acceptance rates."""
        return cls(chain_tau={g: 1 + sum(acc[:g]) for g in range(1, len(acc) + 1)}, source=source)

    @classmethod
    def synthetic(cls, alpha: float = 0.89, depth: int = 15, per_doubling: float = 0.4,
                  budgets=(4, 8, 16, 32, 64, 128, 256, 512, 1024)) -> "Acceptance":
        """Chain: geometric acceptance, tau(gamma) = sum_{k<=gamma} alpha^k (7.68 at gamma 15, near DFlash's
        7.79 on Qwen3-8B MATH-500). Tree: tau(B) = chain tau(min(B, depth)) + per_doubling x log2(1 + B / 4),
        capped at B + 1: 8.6 at B=16 -> 10.9 at B=1024, the log-linear rise of DDTree's budget curve."""
        chain = {g: sum(alpha ** k for k in range(g + 1)) for g in range(1, depth + 1)}
        tree = {b: min(b + 1.0, chain[min(b, depth)] + per_doubling * math.log2(1 + b / 4)) for b in budgets}
        return cls(chain_tau=chain, tree_tau=tree,
                   source=f"synthetic: chain alpha={alpha}, tree = chain + {per_doubling}*log2(1+B/4)")


class ModelTarget(_Strict):
    """Target facts needed for the all-reduce term."""

    name: str = "target"
    layers: int = Field(ge=1)
    hidden: int = Field(ge=1)
    drafter_layers: int = Field(1, ge=0)


class CostModelInput(Section):
    """Everything ``bench model`` predicts from (YAML/JSON); every field is printed with the prediction."""

    target: ModelTarget
    hardware: Hardware = Hardware()
    measured: MeasuredCosts | None = None
    roofline: Roofline | None = None
    acceptance: Acceptance
    block_size: int = Field(16, ge=2, description="drafter block B: a chain has at most B - 1 drafts")
    concurrency: list[int] = [1, 2, 4, 8, 16, 32]
    budgets: list[int] = [4, 8, 16, 32, 64, 128]

    @model_validator(mode="after")
    def _one_source(self) -> "CostModelInput":
        if (self.measured is None) == (self.roofline is None):
            raise ValueError("give exactly one of `measured` (profiled costs) or `roofline` (hardware figures)")
        return self

    @property
    def max_depth(self) -> int:
        """Deepest draft a round can accept: the block's slots after the bonus token."""
        return self.block_size - 1


class CostModel:
    """Predicts per-round times and speedups from a :class:`CostModelInput`."""

    def __init__(self, inp: CostModelInput):
        self.inp = inp
        self.hw = inp.hardware

    def _allreduce(self, tokens: float, layers: int) -> float:
        return 2 * layers * self.hw.allreduce_ms(tokens * self.inp.target.hidden * 2)

    def forward_ms(self, tokens: float, head_rows: float) -> float:
        """Target forward over ``tokens`` (all sequences of the batch together) + LM head rows + all-reduce."""
        m, r, tp = self.inp.measured, self.inp.roofline, self.hw.tp
        body = m.body(tokens) + m.head(head_rows) if m else r.body(tokens, tp)
        return body + self._allreduce(tokens, self.inp.target.layers)

    def draft_ms(self, bs: int) -> float:
        m, r = self.inp.measured, self.inp.roofline
        base = m.draft(bs) if m else r.draft(bs, self.hw.tp)
        return base + self._allreduce(bs * self.inp.block_size, self.inp.target.drafter_layers)

    def host_ms(self, bs: int, nodes: int) -> float:
        m, r = self.inp.measured, self.inp.roofline
        if m:
            return bs * (m.host(nodes) + m.commit_ms)
        return r.host_ms_base + bs * r.host_ms_per_node * nodes

    def ar_ms(self, bs: int) -> float:
        m = self.inp.measured
        return self.forward_ms(bs, bs) + (bs * m.commit_ms if m else self.inp.roofline.host_ms_base)

    def round_ms(self, bs: int, nodes: int, spine: int) -> float:
        """One draft-verify round: ``nodes`` drafted nodes + root per sequence, ``spine`` LM-head rows each."""
        return self.draft_ms(bs) + self.forward_ms(bs * (nodes + 1), bs * spine) + self.host_ms(bs, nodes)

    def chain(self, bs: int, gamma: int) -> dict:
        tau = self.inp.acceptance.chain_tau[gamma]
        t = self.round_ms(bs, gamma, gamma + 1)
        return dict(method="dflash", budget=gamma, tau=tau, round_ms=t, speedup=tau * self.ar_ms(bs) / t)

    def tree(self, bs: int, budget: int, tau: float) -> dict:
        # head rows the walk scores: the measured spine length, else its upper bound (a full-depth spine)
        spine = self.inp.acceptance.tree_spine.get(budget, min(budget, self.inp.max_depth) + 1)
        t = self.round_ms(bs, budget, spine)
        return dict(method="ddtree", budget=budget, tau=tau, round_ms=t, speedup=tau * self.ar_ms(bs) / t)

    def predict(self) -> dict:
        """Rows per (concurrency, method, budget); the best choice per concurrency; where speculation stops paying."""
        acc, g_max = self.inp.acceptance, self.inp.max_depth
        rows, best = [], []
        for bs in self.inp.concurrency:
            cand = []
            for b in self.inp.budgets:
                g = min(b, g_max)
                if g in acc.chain_tau:
                    cand.append(self.chain(bs, g) | dict(budget=b, gamma=g))
                if b in acc.tree_tau:
                    cand.append(self.tree(bs, b, acc.tree_tau[b]))
            for c in cand:
                c.update(concurrency=bs, ar_ms=self.ar_ms(bs))
            rows += cand
            top = max(cand, key=lambda c: c["speedup"]) if cand else None
            pays = top is not None and top["speedup"] > 1
            best.append(dict(concurrency=bs, method=top["method"] if pays else "ar", budget=top["budget"] if pays else None,
                             speedup=top["speedup"] if pays else 1.0,
                             best_speculative=None if top is None else dict(method=top["method"], budget=top["budget"],
                                                                           speedup=top["speedup"])))
        stop = next((b["concurrency"] for b in best if b["method"] == "ar"), None)
        return dict(rows=rows, best=best, stops_paying_at=stop, inputs=self.inp.model_dump(mode="json"))


def preset_kimi_k2_pcie8() -> CostModelInput:
    """ASSUMED example: 8-GPU PCIe box, 1T-parameter MoE target (Kimi-K2-like), TP=8, concurrency 1..32.

    Target: 61 layers (1 dense + 60 MoE), hidden 7168, 384 routed experts (8 per token) + 1 shared,
    expert FFN 2048 -> one expert over 60 layers = 3 x 7168 x 2048 x 60 = 2.64 B params; dense part
    (attention, shared expert, dense layer, head) = 32 B active - 8 x 2.64 B = 10.9 B; total ~1.03 T.
    GPUs: 8 x H200-NVL-class PCIe cards without an NVLink bridge (141 GB, 4.8 TB/s, 835 TFLOP/s dense),
    fp8 weights (1 byte/param), 60% of both roofs. Drafter: DFlash, 5 dense layers (~4 B params with its
    share of the head), block 16, also TP=8. Host: 0.3 ms per round + 2 us per drafted node. Acceptance:
    synthetic (see :meth:`Acceptance.synthetic`), tau rising with the tree budget.
    """
    return CostModelInput(
        target=ModelTarget(name="1T MoE (Kimi-K2-like)", layers=61, hidden=7168, drafter_layers=5),
        hardware=Hardware(gpus=8, tp=8, interconnect="pcie"),
        roofline=Roofline(mem_bw_tbps=4.8, peak_tflops=835, weight_bytes_per_param=1.0, dense_params_b=10.9,
                          expert_params_b=3 * 7168 * 2048 * 60 / 1e9, num_experts=384, experts_per_token=8,
                          efficiency=0.6, draft_params_b=4.0, draft_block=16, host_ms_base=0.3, host_ms_per_node=0.002),
        acceptance=Acceptance.synthetic(),
        block_size=16,
        concurrency=[1, 2, 4, 8, 16, 32],
        budgets=[4, 8, 16, 32, 64, 128, 256, 512],
    )


def preset_h200_dense8b() -> CostModelInput:
    """ASSUMED example for the published budget-curve shape: Qwen3-8B-like dense target (36 layers,
    hidden 4096, 8.2 B params, bf16) on ONE H200 (4.8 TB/s, 989 TFLOP/s dense, ridge ~206 tokens),
    a 5-layer ~1 B DFlash drafter, synthetic acceptance with tau rising with the budget."""
    return CostModelInput(
        target=ModelTarget(name="8B dense (Qwen3-8B-like)", layers=36, hidden=4096, drafter_layers=5),
        hardware=Hardware(gpus=1, tp=1, interconnect="none"),
        roofline=Roofline(mem_bw_tbps=4.8, peak_tflops=989, weight_bytes_per_param=2.0, dense_params_b=8.2,
                          efficiency=0.7, draft_params_b=1.0, draft_block=16, host_ms_base=0.3, host_ms_per_node=0.002),
        acceptance=Acceptance.synthetic(),
        concurrency=[1, 2, 4, 8, 16, 32],
        budgets=[16, 32, 64, 128, 256, 512, 1024],
    )


PRESETS = {"kimi-k2-pcie8": preset_kimi_k2_pcie8, "h200-dense8b": preset_h200_dense8b}
