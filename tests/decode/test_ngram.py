"""Prompt lookup (``ngram`` / ``ngram_tree``): the lookup itself, and greedy output equal to AR."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from flashdraft.decode import DECODERS, DecodeError, build_decoder
from flashdraft.decode.lookup import lookup
from flashdraft.decode.ngram import merge_branches
from tests.lossless import assert_same_tokens
from tests.tiny import hf_greedy, random_prompts, tiny_target

NEW = 40


def t(xs):
    return torch.tensor(xs, dtype=torch.long)


def test_lookup_takes_the_longest_ngram_then_the_most_recent_match():
    # last 2-gram (7, 8) occurs at 0 and 5; the most recent earlier occurrence (5) wins
    ctx = [7, 8, 1, 2, 3, 7, 8, 4, 5, 6, 9, 7, 8]
    assert lookup(t(ctx), k=3, max_n=2) == [[4, 5, 6]]
    # n = 3 (1, 7, 8) matches nowhere, but (x, 7, 8) does not either; fall back to n = 2
    assert lookup(t(ctx), k=3, max_n=3) == [[4, 5, 6]]
    # a 3-gram match beats a more recent 1-gram match
    ctx = [1, 2, 3, 50, 51, 9, 3, 60, 1, 2, 3]
    assert lookup(t(ctx), k=2, max_n=3) == [[50, 51]]
    assert lookup(t(ctx), k=2, max_n=3, min_n=1, branches=3) == [[50, 51], [60, 1]]


def test_lookup_edges():
    assert lookup(t([5]), k=4) == []
    assert lookup(t([1, 2, 3, 4]), k=4) == []  # nothing repeats
    assert lookup(t([1, 2, 1]), k=4) == [[2, 1, 2, 1]]  # past the end the period 1, 2 goes on
    assert lookup(t([1, 2, 1]), k=4, min_n=2) == []
    assert lookup(t([4, 4, 4, 4]), k=2, max_n=2) == [[4, 4]]
    assert lookup(t([1, 2, 3, 9, 1, 2, 3]), k=5) == [[9, 1, 2, 3, 9]]


def test_merge_branches_shares_prefixes_and_respects_the_budget():
    tree = merge_branches(0, [[1, 2, 3], [1, 2, 4], [5]], budget=10)
    assert tree.prefixes() == {(1,), (1, 2), (1, 2, 3), (1, 2, 4), (5,)}
    assert tree.spine() == [0, 1, 2, 3]  # the first (best) branch
    small = merge_branches(0, [[1, 2, 3], [1, 2, 4], [5]], budget=3)
    assert len(small) - 1 == 3 and small.prefixes() == {(1,), (1, 2), (1, 2, 3)}


def test_registered_and_needs_no_drafter():
    assert {"ngram", "ngram_tree"} <= set(DECODERS)
    target = tiny_target("qwen3", num_hidden_layers=2)
    dec = build_decoder("ngram", target)
    assert dec.max_depth == 7 and build_decoder("ngram", target, budget=3).max_depth == 3
    with pytest.raises(DecodeError, match="budget"):
        build_decoder("ngram", target, budget=0)


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "llama"])
@pytest.mark.parametrize("method,budget", [("ngram", None), ("ngram", 3), ("ngram_tree", 16)])
def test_greedy_equals_hf_generate(family, method, budget):
    target = tiny_target(family)
    dec = build_decoder(method, target, budget=budget)
    taus = []
    prompts = random_prompts(3, 20, seed=7)
    prompts.append(prompts[0][:10] * 3)  # a repetitive prompt: lookups hit from the first round
    for p in prompts:
        res = dec.generate(p, NEW)
        assert_same_tokens(target, p, res.tokens, hf_greedy(target, p, NEW), f"{method}/{family}")
        assert len(res.tokens) == NEW
        taus += res.stats.taus
    assert max(taus) > 1, "no draft was ever accepted: the test exercised only rejections"


def test_t1_sampling_stays_exact():
    """Second-token law under ngram / ngram_tree sampling equals the target's exact law (chi-square)."""
    V, draws, prompt = 10, 600, [3, 1, 4, 1, 5, 3, 1]
    target = tiny_target("qwen3", vocab_size=V, num_hidden_layers=2, seed=11)
    with torch.no_grad():
        p1 = torch.softmax(target.model(torch.tensor([prompt])).logits[0, -1], -1)
        p2 = torch.softmax(target.model(torch.tensor([prompt + [x] for x in range(V)])).logits[:, -1], -1)
    law = (p1[:, None] * p2).sum(0).double().numpy()
    law /= law.sum()
    for method in ("ngram", "ngram_tree"):
        dec = build_decoder(method, target, budget=6)
        counts, accepted = np.zeros(V, dtype=np.int64), 0
        for seed in range(draws):
            g = dec.generate(prompt, 3, temperature=1.0, seed=seed)  # 3: the first round may commit a draft + more
            counts[g.tokens[1]] += 1
            accepted += g.stats.taus[0] > 1 if g.stats.taus else 0  # the second token was a draft it accepted
        keep = law * draws >= 5
        c = np.append(counts[keep], counts[~keep].sum())
        e = np.append(law[keep], law[~keep].sum()) * draws
        c, e = (c, e) if e[-1] > 0 else (c[:-1], e[:-1])
        assert chisquare(c, e).pvalue > 1e-3, (method, counts, law * draws)
        assert accepted > draws // 20, f"{method}: drafts were almost never accepted ({accepted}); the test is vacuous"


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_hybrid_tree_is_lossless_and_keeps_the_budget(family):
    from flashdraft.models.dflash import DFlashDrafter
    from tests.tiny import MASK_ID, OracleDrafter

    target = tiny_target(family)
    random_d = DFlashDrafter.for_target(target, num_layers=1, block_size=6, mask_token_id=MASK_ID, seed=3)
    prompts = random_prompts(2, 20, seed=9)
    prompts.append(prompts[0][:10] * 3)
    taus = {}
    for name, d in (("random", random_d), ("oracle", OracleDrafter(target, block_size=6))):
        dec = build_decoder("ddtree_ngram", target, d, budget=10)
        taus[name] = []
        for p in prompts:
            res = dec.generate(p, 30)
            assert_same_tokens(target, p, res.tokens, hf_greedy(target, p, 30), f"ddtree_ngram/{name}/{family}")
            taus[name].append(res.stats.taus)
    for t in taus["oracle"]:  # the drafter's own chain is still in the tree: whole blocks, the last cut at 30 tokens
        assert t[:-1] == [6] * (len(t) - 1) and sum(t) == 29, t
    assert max(max(t) for t in taus["random"]) > 1  # the lookup chain rescues rounds a random drafter would lose
    tree = dec.draft_tree(7, ((torch.randn(5, target.vocab_size), None), [[1, 2, 3, 4, 5]]))
    assert len(tree) - 1 <= 10 and (1, 2, 3, 4, 5) in tree.prefixes()


@pytest.mark.parametrize("method", ["ngram", "ngram_tree"])
def test_lookup_min_drafts_only_on_long_matches_and_stays_lossless(method):
    """lookup_min = 3: a round whose context has no earlier 3-gram match drafts nothing (tau 1, a plain step);
    the output still equals AR, and the stricter lookup drafts in fewer rounds than lookup_min = 1."""
    target = tiny_target("qwen3")
    prompts = random_prompts(2, 20, seed=7)
    prompts.append(prompts[0][:10] * 3)
    drafted = {}
    for lo in (1, 3):
        dec = build_decoder(method, target, budget=6, lookup_min=lo, lookup_max=3)
        n_drafted, n_rounds = 0, 0
        propose = dec.drafter.propose

        def counting(tokens, new_features=None):
            nonlocal n_drafted, n_rounds
            out = propose(tokens, new_features)
            for cont in out:  # every proposal comes from a match of at least lookup_min tokens
                n = next(n for n in range(3, 0, -1) if lookup(tokens, len(cont), 3, n, 1))
                assert n >= lo
            n_drafted += bool(out)
            n_rounds += 1
            return out

        dec.drafter.propose = counting
        for p in prompts:
            res = dec.generate(p, NEW)
            assert_same_tokens(target, p, res.tokens, hf_greedy(target, p, NEW), f"{method}/lookup_min={lo}")
        drafted[lo] = n_drafted / n_rounds
    assert 0 < drafted[3] < drafted[1], drafted


def test_lookup_options_reach_the_hybrid_and_unknown_options_are_named():
    from tests.tiny import OracleDrafter

    target = tiny_target("qwen3", num_hidden_layers=2)
    dec = build_decoder("ddtree_ngram", target, OracleDrafter(target, block_size=4), budget=8, lookup_min=2, lookup_max=4)
    assert (dec.drafter.lookup.min_n, dec.drafter.lookup.max_n) == (2, 4)
    with pytest.raises(DecodeError, match="1 <= lookup_min <= lookup_max, got lookup_min=4"):
        build_decoder("ngram", target, lookup_min=4, lookup_max=3)
    with pytest.raises(DecodeError, match=r"'dflash' has no option lookup_min .*drop it"):
        build_decoder("dflash", target, OracleDrafter(target, block_size=4), lookup_min=2)
