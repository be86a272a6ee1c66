"""Cost-aware tree sizing: the chosen size maximises expected tokens per verify second, the cut tree is a
tree, the measured cost table is sane, and decoding with it stays token-identical to AR."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashdraft.decode import DecodeError, build_decoder
from flashdraft.decode.sizing import VerifyCosts, cost_sized, truncated, verify_costs
from flashdraft.decode.tree import best_first_tree
from tests.lossless import assert_same_tokens
from tests.tiny import OracleDrafter, hf_greedy, random_prompts, tiny_target


def flat_head(body: list[float], rows: int = 8) -> VerifyCosts:
    """A cost table whose LM head costs nothing: the round's cost is the body's."""
    return VerifyCosts(body=body, head=[0.0] * (rows + 1))


@settings(max_examples=60, deadline=None)
@given(depth=st.integers(1, 4), vocab=st.integers(2, 6), budget=st.integers(1, 24), seed=st.integers(0, 10_000),
       slope=st.floats(0.0, 1.0), head_slope=st.floats(0.0, 1.0), cut_p=st.sampled_from([0.0, 0.1, 0.5]))
def test_cost_sized_is_the_best_prefix_of_the_best_first_order(depth, vocab, budget, seed, slope, head_slope, cut_p):
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(depth, vocab, generator=g) * 2, dim=-1)
    tree = best_first_tree(root=7, log_probs=lp, budget=budget)
    costs = VerifyCosts(body=[1.0 + slope * max(n - 1, 0) for n in range(budget + 2)],  # n tokens through the body
                        head=[head_slope * r for r in range(depth + 2)])  # r LM-head rows
    min_lp = math.log(cut_p) if cut_p else -math.inf
    cut = cost_sized(tree, costs, min_logprob=min_lp)
    m = len(cut) - 1

    def rate(k):  # from the cut tree itself: its spine, plus the chance of each node hanging off the spine
        t = truncated(tree, k)
        spine = t.spine(0, min_lp)
        off = sum(math.exp(t.scores[i]) for i in range(1, len(t)) if i not in spine and t.parents[i] in spine)
        return (1 + sum(math.exp(s) for s in tree.scores[1 : k + 1])) / costs.round(k + 1, len(spine) + off)

    assert rate(m) >= max(rate(k) for k in range(len(tree))) - 1e-12
    assert cut.tokens == tree.tokens[: m + 1] and cut.parents == tree.parents[: m + 1]
    for i in range(1, len(cut)):  # still a tree: parents precede children, children maps rebuilt
        assert cut.parents[i] < i and cut.children[cut.parents[i]][cut.tokens[i]] == i
    if slope == 0.0:
        assert m == len(tree) - 1  # a flat cost (a GPU at batch 1): every node pays


def test_keep_holds_the_first_nodes_and_unlikely_drafts_are_dropped():
    tree = best_first_tree(root=5, log_probs=torch.log_softmax(torch.zeros(2, 50), -1), budget=8)
    steep = flat_head([1.0] + [1.0 + 0.5 * (n - 1) for n in range(1, 11)])  # n tokens: half a step more per token
    assert len(cost_sized(tree, steep)) == 1  # p = 0.02 per node: nothing pays for a dearer verify
    assert len(cost_sized(tree, steep, keep=3)) == 4
    sure = best_first_tree(root=5, log_probs=torch.log_softmax(torch.tensor([[9.0, 0.0], [9.0, 0.0]]), -1), budget=4)
    assert cost_sized(sure, steep).prefixes() >= {(0,), (0, 0)}  # near-certain drafts pay for the dearer verify
    with pytest.raises(ValueError, match="cost table covers"):
        cost_sized(tree, flat_head(steep.body[:3]))


def test_verify_costs_are_measured_once_per_target():
    target = tiny_target("qwen3", num_hidden_layers=2)
    costs = verify_costs(target, 9, context=16, repeats=1, max_rows=4)
    assert len(costs.body) == 10 and all(c > 0 for c in costs.body) and costs.body[0] == costs.body[1]
    assert len(costs.head) == 5 and costs.head[0] == 0 and all(c > 0 for c in costs.head[1:])
    for t in (costs.body[1:], costs.head):
        assert all(b >= a for a, b in zip(t, t[1:]))  # never cheaper for more tokens or rows
    assert costs.round(3, 2.5) == pytest.approx(costs.body[3] + (costs.head[2] + costs.head[3]) / 2)
    assert verify_costs(target, 9, context=16, repeats=1, max_rows=4) is costs  # cached on the target


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_cost_sizing_stays_lossless(family):
    from flashdraft.models.dflash import DFlashDrafter
    from tests.tiny import MASK_ID

    target = tiny_target(family)
    target._verify_costs = {}
    prompts = random_prompts(2, 20, seed=5)
    drafters = {"oracle": OracleDrafter(target, block_size=6),
                "random": DFlashDrafter.for_target(target, num_layers=1, block_size=6, mask_token_id=MASK_ID, seed=3)}
    for (name, d), method in itertools.product(drafters.items(), ["ddtree", "ddtree_ngram"]):
        dec = build_decoder(method, target, d, budget=10, sizing="cost")
        dec._costs = flat_head([1.0, 1.0] + [1.5] * 10)  # a CPU-like table: a second token costs half a step more
        taus = []
        for p in prompts:
            res = dec.generate(p, 24)
            assert_same_tokens(target, p, res.tokens, hf_greedy(target, p, 24), f"{method}+cost/{name}/{family}")
            taus += res.stats.taus
        if name == "oracle":
            assert min(taus) > 1  # confident drafts are still verified
    with pytest.raises(DecodeError, match="sizing 'bogus' is not one of fixed, cost"):
        build_decoder("ddtree", target, drafters["oracle"], sizing="bogus")
