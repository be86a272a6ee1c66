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
        # every round accepts the whole block; the last one commits only what fits in NEW (1 from the prefill)
        assert res.stats.taus[:-1] == [B] * (len(res.stats.taus) - 1) and sum(res.stats.taus) == NEW - 1, res.stats.taus
        assert res.stats.taus[-1] == ((NEW - 1) % B or B)


@pytest.mark.parametrize("method", ["dflash", "ddtree"])
def test_tau_counts_committed_tokens_only(method):
    """tau = tokens committed / verify rounds: a last round that overshoots max_new_tokens, or runs past a stop
    token, counts only the tokens it emitted, and so do the histogram and per-position acceptance."""
    import dataclasses

    target, B = tiny_target("qwen3"), 8
    p = random_prompts(1, 20, seed=3)[0]
    dec = build_decoder(method, target, OracleDrafter(target, block_size=B), budget=7)
    res = dec.generate(p, 12)  # prefill 1 + a full round of 8 + a round that verifies 8 but may emit only 3
    assert len(res.tokens) == 12 and res.stats.taus == [8, 3] and res.stats.tau_mean == 5.5
    assert res.stats.accepted == [7, 7]  # what the verifier accepted, as an engine's counters count it
    assert res.stats.tau_histogram()[8] == 1 and res.stats.tau_histogram()[3] == 1
    assert res.stats.per_position_acceptance()[:3] == [1.0, 1.0, 0.5]  # tau 3 = drafts 1-2 accepted + the bonus
    # a stop token inside a round: that round emits up to and including it
    full = build_decoder("ar", target).generate(p, 12).tokens
    stop_tok = full[5]
    first = full.index(stop_tok)
    eos_target = dataclasses.replace(target, eos_token_ids=[stop_tok])
    dec = build_decoder(method, eos_target, OracleDrafter(eos_target, block_size=B), budget=7)
    res = dec.generate(p, 40)
    assert res.tokens == full[: first + 1]
    assert sum(res.stats.taus) == len(res.tokens) - 1 and max(res.stats.taus) <= B


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
