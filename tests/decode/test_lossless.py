"""Greedy DFlash and DDTree output equals AR (and HF generate) token for token on tiny targets."""

import pytest
import torch

from flashdraft.decode import build_decoder
from flashdraft.models.dflash import DFlashDrafter
from tests.lossless import assert_same_tokens
from tests.tiny import MASK_ID, OracleDrafter, hf_greedy, random_prompts, tiny_target

FAMILIES = ["qwen3", "gemma3", "llama"]
NEW = 40


@pytest.fixture(scope="module", params=FAMILIES)
def target(request):
    return tiny_target(request.param)


def test_ar_harness_matches_hf_generate(target):
    for p in random_prompts(4, 20, seed=1):
        got = build_decoder("ar", target).generate(p, NEW).tokens
        assert_same_tokens(target, p, got, hf_greedy(target, p, NEW), f"ar/{target.name}")


@pytest.mark.parametrize("method,budget", [("dflash", None), ("ddtree", 4), ("ddtree", 48)])
def test_random_drafter_is_lossless(target, method, budget):
    """A random drafter is rejected almost always: every reject path, same tokens."""
    drafter = DFlashDrafter.for_target(target, num_layers=2, block_size=8, mask_token_id=MASK_ID, seed=3)
    ar = build_decoder("ar", target)
    dec = build_decoder(method, target, drafter, budget=budget)
    for p in random_prompts(4, 20, seed=2):
        res = dec.generate(p, NEW)
        assert_same_tokens(target, p, res.tokens, ar.generate(p, NEW).tokens, f"{method}/{target.name}")
        assert len(res.tokens) == NEW and res.stats.rounds >= 1


@pytest.mark.parametrize("method,budget", [("dflash", None), ("ddtree", 7), ("ddtree", 40)])
def test_oracle_drafter_full_acceptance(target, method, budget):
    """A drafter proposing the target's own continuation is accepted whole: tau = B every round."""
    B = 8
    dec = build_decoder(method, target, OracleDrafter(target, block_size=B), budget=budget)
    ar = build_decoder("ar", target)
    for p in random_prompts(3, 20, seed=3):
        res = dec.generate(p, NEW)
        assert_same_tokens(target, p, res.tokens, ar.generate(p, NEW).tokens, f"oracle-{method}/{target.name}")
        assert res.stats.taus == [B] * len(res.stats.taus), res.stats.taus
        assert res.stats.per_position_acceptance() == [1.0] * (B - 1)


def test_prompt_longer_than_sliding_window():
    """Tiny Gemma3 has a window of 8: a 50-token prompt and 40 new tokens cross it many times."""
    target = tiny_target("gemma3", sliding_window=8)
    drafter = DFlashDrafter.for_target(target, num_layers=1, block_size=6, mask_token_id=MASK_ID)
    p = random_prompts(1, 50, seed=4)[0]
    ref = hf_greedy(target, p, NEW)
    for method, d in [("dflash", drafter), ("ddtree", drafter), ("dflash", OracleDrafter(target, 6)), ("ddtree", OracleDrafter(target, 6))]:
        got = build_decoder(method, target, d, budget=12).generate(p, NEW).tokens
        assert_same_tokens(target, p, got, ref, f"{method}/window")


def test_stop_token_ends_generation():
    target = tiny_target("qwen3")
    p = random_prompts(1, 20, seed=5)[0]
    ref = hf_greedy(target, p, NEW)
    target.eos_token_ids = [ref[10]]  # the 11th greedy token (or an earlier repeat of it) now stops decoding
    first = ref.index(ref[10])
    for method, d in [("ar", None), ("dflash", OracleDrafter(target, 8)), ("ddtree", OracleDrafter(target, 8))]:
        got = build_decoder(method, target, d, budget=16).generate(p, NEW).tokens
        assert got == ref[: first + 1], method


def test_stats_are_consistent():
    target = tiny_target("qwen3")
    p = random_prompts(1, 20, seed=6)[0]
    res = build_decoder("ddtree", target, OracleDrafter(target, 8), budget=16).generate(p, 30)
    s = res.stats
    assert sum(s.taus) + 1 >= s.new_tokens  # the prefill gives the first token
    assert sum(s.tau_histogram().values()) == s.rounds
    assert set(s.stage_seconds) == {"prefill", "draft", "tree_build", "verify", "commit"}
    assert all(v >= 0 for v in s.stage_seconds.values()) and s.total_seconds >= sum(s.stage_seconds.values()) * 0.99
    d = s.to_dict()
    assert d["tau_mean"] == pytest.approx(sum(s.taus) / len(s.taus))
