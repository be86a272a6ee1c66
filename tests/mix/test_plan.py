import pytest

from flashdraft.mix.domains import MixError, parse_mix
from flashdraft.mix.plan import Candidate, hours_for, render_plan, solve_plan

LABELS = ["coding", "math", "general", "tool_calling", "agent", "translation", "other"]
# the team's situation from the issue: 77% coding, 15% general, 6% tool calling, 1% math, 1% translation
CURRENT = {"coding": 77_000, "general": 15_000, "tool_calling": 6_000, "math": 1_000, "translation": 1_000}
TARGET = parse_mix("coding=0.46,general=0.26,math=0.11,agent=0.09,tool_calling=0.05,translation=0.01,other=0.02",
                   LABELS)
CANDIDATES = [
    Candidate("infinity-instruct", {"general": 0.7, "math": 0.2, "coding": 0.1}, 400_000),
    Candidate("nemotron-v2", {"math": 0.6, "coding": 0.3, "general": 0.1}, 400_000),
    Candidate("hermes-fc", {"tool_calling": 0.9, "general": 0.1}, 100_000),
    Candidate("agent-set", {"agent": 0.85, "coding": 0.1, "other": 0.05}, 100_000),
    Candidate("misc", {"other": 0.8, "general": 0.2}, 50_000),
]


def test_reaches_target_within_one_point_when_possible():
    plan = solve_plan(CURRENT, CANDIDATES, TARGET, total=200_000)
    assert plan.feasible and not plan.short
    shares = plan.expected_shares()
    for d in LABELS:
        assert abs(shares[d] - TARGET[d]) <= 0.01, (d, shares[d], TARGET[d])
    assert sum(plan.kept.values()) == 100_000  # no down-sampling unless allowed
    assert sum(plan.take.values()) == 100_000
    assert all(0 <= plan.take[c.name] <= c.available for c in CANDIDATES)
    text = render_plan(plan, CANDIDATES, hours_for(plan.new_prompts, gpu_hours_per_600k=13))
    assert "HiGHS" in text and "infinity-instruct" in text and "GPU-hours" in text


def test_names_the_short_domain_when_impossible():
    no_math = [c for c in CANDIDATES if c.name not in ("nemotron-v2", "infinity-instruct")]
    no_math.append(Candidate("general-only", {"general": 1.0}, 400_000))
    plan = solve_plan(CURRENT, no_math, TARGET, total=200_000)
    assert not plan.feasible and "math" in plan.short
    assert "short: math" in render_plan(plan, no_math, None)


def test_downsampling_current_data():
    cands = [Candidate("gen", {"general": 1.0}, 10_000)]
    assert not solve_plan({"coding": 900, "general": 100}, cands, parse_mix("coding=0.5,general=0.5", LABELS),
                          1000).feasible
    plan = solve_plan({"coding": 900, "general": 100}, cands, parse_mix("coding=0.5,general=0.5", LABELS), 1000,
                      allow_downsample=True)
    assert plan.feasible and plan.kept["coding"] == 500 and plan.take["gen"] == 400


def test_errors_name_the_fix():
    with pytest.raises(MixError, match="more than --total"):
        solve_plan(CURRENT, CANDIDATES, TARGET, total=50_000)
    with pytest.raises(MixError, match="fewer than --total"):
        solve_plan(CURRENT, CANDIDATES[:1], TARGET, total=10_000_000)


def test_hours():
    assert hours_for(600_000, gpu_hours_per_600k=13) == pytest.approx(13)
    assert hours_for(1000, prompts_per_hour=500) == pytest.approx(2)
    assert hours_for(1000) is None
    with pytest.raises(MixError, match="not both"):
        hours_for(1, prompts_per_hour=1, gpu_hours_per_600k=1)
