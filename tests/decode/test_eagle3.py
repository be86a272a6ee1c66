"""EAGLE-3 chain and dynamic-tree decoding: lossless at T = 0 (random and oracle drafters, sliding-window
Gemma3 included) and at T > 0 (exact second-token law); block drafters are refused by capability."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from flashdraft.decode import DecodeError, build_decoder
from flashdraft.models.dflash import DFlashDrafter
from flashdraft.models.eagle3 import Eagle3Drafter
from tests.decode.test_sampling import P_MIN, PROMPT, exact_second_token_law, merged
from tests.lossless import assert_same_tokens
from tests.tiny import MASK_ID, Eagle3Oracle, hf_greedy, random_prompts, tiny_target

FAMILIES = ["qwen3", "gemma3", "llama"]
NEW = 40
DRAWS = 600  # per method: enough for the chi-square to reject a wrong law at P_MIN
SETTINGS = [("eagle3", None), ("eagle3", 3), ("eagle3_tree", None), ("eagle3_tree", 5)]


@pytest.fixture(scope="module", params=FAMILIES)
def target(request):
    return tiny_target(request.param)


@pytest.mark.parametrize("method,budget", SETTINGS)
def test_random_drafter_is_lossless(target, method, budget):
    drafter = Eagle3Drafter.for_target(target, draft_vocab=torch.arange(0, target.vocab_size, 2), seed=3)
    ar = build_decoder("ar", target)
    dec = build_decoder(method, target, drafter, budget=budget)
    for p in random_prompts(3, 20, seed=2):
        res = dec.generate(p, NEW)
        assert_same_tokens(target, p, res.tokens, ar.generate(p, NEW).tokens, f"{method}/{target.name}")
        assert len(res.tokens) == NEW and res.stats.rounds >= 1


@pytest.mark.parametrize("method,budget", SETTINGS)
def test_oracle_drafter_is_accepted(target, method, budget):
    """The target's own distribution as the draft: the chain is accepted whole; the tree always holds
    the greedy first token (the best-scored node), so every round commits at least two tokens."""
    dec = build_decoder(method, target, Eagle3Oracle.for_target(target, max_depth=5), budget=budget)
    ar = build_decoder("ar", target)
    for p in random_prompts(2, 20, seed=3):
        res = dec.generate(p, NEW)
        assert_same_tokens(target, p, res.tokens, ar.generate(p, NEW).tokens, f"oracle-{method}/{target.name}")
        taus = res.stats.taus[:-1]  # the last round may be cut by max_new_tokens
        if method == "eagle3":
            assert taus == [dec.max_depth + 1] * len(taus), taus
        else:
            assert min(taus) >= 2 and max(taus) >= 3, taus


def test_prompt_longer_than_sliding_window():
    """Tiny Gemma3 has a window of 8: a 50-token prompt and 40 new tokens cross it many times."""
    target = tiny_target("gemma3", sliding_window=8)
    p = random_prompts(1, 50, seed=4)[0]
    ref = hf_greedy(target, p, NEW)
    for d in (Eagle3Drafter.for_target(target, seed=1), Eagle3Oracle.for_target(target)):
        for method in ("eagle3", "eagle3_tree"):
            got = build_decoder(method, target, d, budget=12).generate(p, NEW).tokens
            assert_same_tokens(target, p, got, ref, f"{method}/{type(d).__name__}/window")


def test_tree_has_the_requested_shape():
    target = tiny_target("qwen3")
    d = Eagle3Drafter.for_target(target, seed=2)
    toks = torch.tensor(random_prompts(1, 12)[0])
    feats = torch.randn(11, len(d.target_layer_ids) * target.hidden_size)
    for top_k, depth, total in [(10, 7, 60), (3, 2, 12), (4, 5, 200)]:
        d.reset()
        tree = d.propose_tree(toks, feats, top_k, depth, total)
        assert len(tree) - 1 == min(total, top_k + depth * top_k * top_k)
        assert tree.tokens[0] == int(toks[-1]) and max(tree.depths) <= depth + 1
        assert all(tree.scores[tree.parents[i]] >= tree.scores[i] for i in range(1, len(tree)))
        assert all(len(c) <= top_k for c in tree.children)
        assert all(tree.depths[i] == tree.depths[tree.parents[i]] + 1 for i in range(1, len(tree)))


def test_block_drafter_is_refused_with_the_methods_to_use():
    target = tiny_target("qwen3")
    d = DFlashDrafter.for_target(target, num_layers=1, block_size=4, mask_token_id=MASK_ID)
    for method in ("eagle3", "eagle3_tree"):
        with pytest.raises(DecodeError, match="dflash.*ddtree"):
            build_decoder(method, target, d)


def test_sampling_matches_the_exact_law():
    target = tiny_target("qwen3", vocab_size=10, num_hidden_layers=4, seed=11)
    law = exact_second_token_law(target)
    oracle = Eagle3Oracle.for_target(target, max_depth=3, target_layer_ids=[0, 1, 2])
    for method, budget in [("eagle3", None), ("eagle3_tree", 6)]:
        dec = build_decoder(method, target, oracle, budget=budget)
        counts = np.bincount([dec.generate(PROMPT, 2, temperature=1.0, seed=s).tokens[1] for s in range(DRAWS)],
                             minlength=len(law))
        c, e = merged(counts, law * DRAWS)
        assert chisquare(c, e).pvalue > P_MIN, (method, counts, law * DRAWS)
    taus = [t for s in range(10) for t in build_decoder("eagle3", target, oracle).generate(PROMPT, 12, 1.0, s).stats.taus]
    assert max(taus) >= 3 and np.mean([t > 1 for t in taus]) > 0.2  # drafts are accepted at T = 1, not only rejected
