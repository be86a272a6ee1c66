"""`flashdraft mix plan`: how many prompts to take from each candidate source to reach a target mix.

Two linear programs (scipy.optimize.linprog, HiGHS) choose ``x_s`` prompts from candidate source
``s`` (0 <= x_s <= available_s) and, when down-sampling is allowed, ``y_d`` kept samples of the
current data in domain ``d`` (0 <= y_d <= current_d; otherwise y_d = current_d), so that

    final_d = y_d + sum_s share_{s,d} * x_s,     sum_d final_d = total,

first minimising the largest deviation ``t* = max_d |final_d / total - target_d|``, then, with every
deviation kept <= t*, the sum of deviations (and, with a small weight, the new prompts to regenerate). ``share_{s,d}`` is the classified composition
of source ``s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from flashdraft.mix.domains import MixError

SOLVER = ("scipy.optimize.linprog (HiGHS), two stages: minimax deviation from the target shares, "
          "then least total deviation")


@dataclass
class Candidate:
    """A candidate prompt source: its classified domain shares and how many prompts it can give."""

    name: str
    shares: dict[str, float]
    available: int


@dataclass
class Plan:
    """The solved plan: prompts per source, expected counts per domain, deviations, shortfalls."""

    labels: tuple[str, ...]
    target: dict[str, float]
    total: int
    current: dict[str, int]
    kept: dict[str, int]
    take: dict[str, int]
    expected: dict[str, float]
    tolerance: float
    solver: str = SOLVER
    short: list[str] = field(default_factory=list)
    over: list[str] = field(default_factory=list)

    @property
    def new_prompts(self) -> int:
        return sum(self.take.values())

    def expected_shares(self) -> dict[str, float]:
        return {d: self.expected[d] / self.total for d in self.labels}

    def max_deviation(self) -> float:
        sh = self.expected_shares()
        return max(abs(sh[d] - self.target[d]) for d in self.labels)

    @property
    def feasible(self) -> bool:
        return self.max_deviation() <= self.tolerance + 1e-9

    def to_json(self) -> dict:
        """What a script needs: prompts to take per source, counts kept and expected per domain, shortfalls."""
        return {"target": self.target, "total": self.total, "take": self.take, "new_prompts": self.new_prompts,
                "kept": self.kept, "expected": self.expected, "expected_shares": self.expected_shares(),
                "feasible": self.feasible, "short": self.short, "over": self.over, "solver": self.solver}


def solve_plan(current: dict[str, int], candidates: list[Candidate], target: dict[str, float], total: int,
               allow_downsample: bool = False, tolerance: float = 0.01) -> Plan:
    """Solve for the prompts to take per candidate; see the module docstring for the program."""
    from scipy.optimize import linprog

    labels = tuple(target)
    cur = {d: int(current.get(d, 0)) for d in labels}
    unknown = sorted(set(current) - set(labels))
    if unknown and any(current[d] for d in unknown):
        raise MixError(f"current data has domains {unknown} that the target does not list; add them to the target "
                       "(e.g. with share 0) or use the same label set")
    if total <= 0:
        raise MixError(f"total size must be a positive number of samples, got {total}")
    n_cur = sum(cur.values())
    if not allow_downsample and n_cur > total:
        raise MixError(f"the current data already has {n_cur:,} samples, more than --total {total:,}; raise --total "
                       "or pass --allow-downsample to let the plan drop current samples")
    supply = sum(c.available for c in candidates)
    if (n_cur + supply) < total:
        raise MixError(f"the candidates offer {supply:,} prompts and the current data {n_cur:,}: fewer than --total "
                       f"{total:,}; add candidate sources, raise their @available, or lower --total")
    ns, nd = len(candidates), len(labels)
    # variables: x (ns prompts per source), y (nd kept current per domain), e (nd |deviation| per domain), t
    nv = ns + 2 * nd + 1
    A_ub, b_ub = [], []
    for j, d in enumerate(labels):
        row = np.zeros(nv)
        for i, c in enumerate(candidates):
            row[i] = c.shares.get(d, 0.0)
        row[ns + j] = 1.0
        for sign in (1.0, -1.0):  # +-(final_d - target_d*T) <= e_d
            r = sign * row
            r[ns + nd + j] = -1.0
            A_ub.append(r)
            b_ub.append(sign * target[d] * total)
        cap = np.zeros(nv)      # e_d <= t*T
        cap[ns + nd + j], cap[-1] = 1.0, -total
        A_ub.append(cap)
        b_ub.append(0.0)
    A_eq = [np.concatenate([np.ones(ns + nd), np.zeros(nd + 1)])]
    b_eq = [float(total)]
    bounds = [(0, c.available) for c in candidates]
    bounds += [((0 if allow_downsample else cur[d]), cur[d]) for d in labels]
    bounds += [(0, None)] * (nd + 1)
    kw = dict(A_ub=np.array(A_ub), b_ub=np.array(b_ub), A_eq=np.array(A_eq), b_eq=np.array(b_eq), method="highs")
    # stage 1: the smallest largest deviation t*
    cost = np.zeros(nv)
    cost[-1] = 1.0
    res = linprog(cost, bounds=bounds, **kw)
    if res.status == 0:
        # stage 2: keeping max deviation <= t*, the smallest total deviation, then the fewest new prompts
        bounds[-1] = (0, res.x[-1] * (1 + 1e-7) + 1e-9)
        cost = np.zeros(nv)
        cost[ns + nd: ns + 2 * nd] = 1.0 / total
        cost[:ns] = 1e-6 / total
        res = linprog(cost, bounds=bounds, **kw)
    if res.status != 0:
        raise MixError(f"the solver found no plan ({res.message}); check --total against the data and candidates")
    x = _round_to_total(res.x[:ns], [c.available for c in candidates], total - round(sum(res.x[ns:ns + nd])))
    y = {d: int(round(res.x[ns + j])) for j, d in enumerate(labels)}
    take = {c.name: int(v) for c, v in zip(candidates, x)}
    expected = {d: y[d] + sum(c.shares.get(d, 0.0) * take[c.name] for c in candidates) for d in labels}
    plan = Plan(labels, dict(target), total, cur, y, take, expected, tolerance)
    sh = plan.expected_shares()
    plan.short = [d for d in labels if sh[d] < target[d] - tolerance]
    plan.over = [d for d in labels if sh[d] > target[d] + tolerance]
    return plan


def _round_to_total(x: np.ndarray, caps: list[int], want: int) -> list[int]:
    """Round non-negative reals to integers within caps so that they sum to ``want`` (largest remainder)."""
    base = [min(cap, math.floor(v + 1e-9)) for v, cap in zip(x, caps)]
    rest = want - sum(base)
    order = sorted(range(len(x)), key=lambda i: -(x[i] - math.floor(x[i] + 1e-9)))
    for i in order * 2:
        if rest <= 0:
            break
        if base[i] < caps[i]:
            base[i] += 1
            rest -= 1
    return base


def hours_for(prompts: int, prompts_per_hour: float | None = None, gpu_hours_per_600k: float | None = None):
    """GPU-hours to regenerate ``prompts`` from a measured throughput, or None if none was given."""
    if prompts_per_hour and gpu_hours_per_600k:
        raise MixError("give either --prompts-per-hour or --gpu-hours-per-600k, not both")
    if prompts_per_hour:
        if prompts_per_hour <= 0:
            raise MixError("--prompts-per-hour must be > 0")
        return prompts / prompts_per_hour
    if gpu_hours_per_600k:
        if gpu_hours_per_600k <= 0:
            raise MixError("--gpu-hours-per-600k must be > 0")
        return prompts / 600_000 * gpu_hours_per_600k
    return None


def render_plan(plan: Plan, candidates: list[Candidate], hours: float | None, throughput_note: str = "") -> str:
    """The plan as markdown that a person can act on."""
    sh = plan.expected_shares()
    cur_total = sum(plan.current.values())
    lines = ["# Data mix plan", "",
             f"Target total: **{plan.total:,}** samples. Solver: {plan.solver}.",
             f"Current data: {cur_total:,} samples; kept: {sum(plan.kept.values()):,}. New prompts to generate: "
             f"**{plan.new_prompts:,}**.", ""]
    if plan.feasible:
        lines += [f"Every domain lands within {plan.tolerance * 100:.1f} percentage points of its target "
                  f"(largest deviation {plan.max_deviation() * 100:.2f} pp).", ""]
    else:
        lines += [f"**The target mix cannot be reached with these candidates** (largest deviation "
                  f"{plan.max_deviation() * 100:.2f} pp > {plan.tolerance * 100:.1f} pp)."]
        for d in plan.short:
            best = max(candidates, key=lambda c: c.shares.get(d, 0.0), default=None)
            hint = (f"; the richest candidate in {d} is {best.name} ({best.shares.get(d, 0) * 100:.1f}% {d}, "
                    f"{best.available:,} available)" if best else "")
            lines.append(f"- **short: {d}** — expected {sh[d] * 100:.1f}% vs target {plan.target[d] * 100:.1f}%{hint}. "
                         f"Add a source rich in {d}, raise its @available, or lower the {d} target.")
        for d in plan.over:
            lines.append(f"- over: {d} — expected {sh[d] * 100:.1f}% vs target {plan.target[d] * 100:.1f}% "
                         f"(current data holds {plan.current[d]:,}); pass --allow-downsample or raise --total.")
        lines.append("")
    lines += ["## Prompts to take per source", "", "| source | take | available | main domains of the source |",
              "|---|---:|---:|---|"]
    for c in candidates:
        top = ", ".join(f"{d} {v * 100:.0f}%" for d, v in sorted(c.shares.items(), key=lambda kv: -kv[1])[:3] if v > 0)
        lines.append(f"| {c.name} | {plan.take[c.name]:,} | {c.available:,} | {top} |")
    lines += ["", "## Expected mix", "", "| domain | current | current share | kept | expected | expected share | "
              "target | delta (pp) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for d in plan.labels:
        cs = plan.current[d] / cur_total if cur_total else 0.0
        lines.append(f"| {d} | {plan.current[d]:,} | {cs * 100:.1f}% | {plan.kept[d]:,} | {plan.expected[d]:,.0f} | "
                     f"{sh[d] * 100:.1f}% | {plan.target[d] * 100:.1f}% | {(sh[d] - plan.target[d]) * 100:+.2f} |")
    lines += ["", "## Regeneration time", ""]
    if hours is None:
        lines.append("Not estimated: pass a measured throughput (--prompts-per-hour or --gpu-hours-per-600k).")
    else:
        lines.append(f"{plan.new_prompts:,} prompts at the measured throughput{throughput_note}: "
                     f"**{hours:,.2f} GPU-hours**.")
    lines += ["", "Expected counts use each source's classified composition; the real mix after "
              "regeneration can differ from it by that classification's error."]
    return "\n".join(lines) + "\n"
