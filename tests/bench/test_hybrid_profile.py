"""The profile prices a hybrid target's tree verify through its exact recurrent path."""

from flashdraft.bench.costmodel import MeasuredCosts
from flashdraft.bench.profile import profile_costs
from tests.tiny import tiny_hybrid, tiny_target


def test_profile_of_a_hybrid_reports_recurrent_cost_and_state():
    target = tiny_hybrid("qwen3_5")
    costs = profile_costs(target, sizes=(1, 8, 33), budgets=(8,), head_rows=[1, 4], context=16, repeats=2, warmup=1)
    assert set(costs.recurrent_ms) == set(costs.body_ms) == {1, 8, 33}
    assert all(costs.recurrent_ms[n] > 0 for n in costs.body_ms)  # time was spent in the mixers (no speed claim)
    # 4 gated-DeltaNet layers: conv window (2 * 2 * 8 + 4 * 8 channels x 4 taps) + state (4 heads x 8 x 8), fp32
    assert costs.recurrent_state_bytes == 4 * (64 * 4 + 4 * 8 * 8) * 4
    again = MeasuredCosts.model_validate_json(costs.model_dump_json())
    assert again.recurrent(8) == costs.recurrent_ms[8] and again.recurrent_per_node() != 0


def test_profile_of_a_dense_target_has_no_recurrent_part():
    costs = profile_costs(tiny_target("qwen3"), sizes=(1, 8), budgets=(8,), head_rows=[1], context=16, repeats=2, warmup=1)
    assert costs.recurrent_ms == {} and costs.recurrent_state_bytes == 0 and costs.recurrent(8) == 0.0


def test_decode_bench_on_a_hybrid_reports_verify_cost_per_budget(tmp_path):
    from flashdraft.bench.decode_bench import run_decode_bench
    from flashdraft.decode import build_decoder
    from tests.tiny import VOCAB, ScriptedDrafter, random_prompts

    target = tiny_hybrid("nemotron_h")
    p = random_prompts(1, 12, seed=3)[0]
    ref = build_decoder("ar", target).generate(p, 40).tokens
    res = run_decode_bench(target, {"s": ScriptedDrafter(VOCAB, len(p), ref, block_size=8, corrupt_every=3)}, {"r": [p]},
                           budgets=[4, 16], temperatures=[0.0], max_new_tokens=16, repeats=1, out_dir=tmp_path,
                           warmup=False, log=lambda m: None)
    rows = res["sets"]["r@T=0"]
    for v in ("s/dflash", "s/ddtree@4", "s/ddtree@16"):
        assert rows[v]["identical_to_ar"] == 1 and rows[v]["stage_ms_per_round"]["verify"] > 0, v
    assert rows["s/ddtree@16"]["tau_mean"] > rows["s/chain@16"]["tau_mean"]  # siblings recover the wrong drafts
