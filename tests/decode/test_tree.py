"""DDTree's tree equals the top-budget prefixes by drafter score (brute force), and tree masks."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashdraft.decode.tree import argmax_chain, best_first_tree, chain_tree


def brute_force_top(log_probs: torch.Tensor, budget: int) -> set[tuple[int, ...]]:
    depth, vocab = log_probs.shape
    scored = []
    for length in range(1, depth + 1):
        for prefix in itertools.product(range(vocab), repeat=length):
            scored.append((sum(float(log_probs[d, t]) for d, t in enumerate(prefix)), prefix))
    scored.sort(reverse=True)
    return {p for _, p in scored[:budget]}


@settings(max_examples=60, deadline=None)
@given(depth=st.integers(1, 4), vocab=st.integers(2, 5), budget=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_tree_is_top_budget_prefixes(depth, vocab, budget, seed):
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(depth, vocab, generator=g) * 2, dim=-1)  # continuous: no ties
    tree = best_first_tree(root=7, log_probs=lp, budget=budget)
    expected = brute_force_top(lp, budget)
    assert tree.prefixes() == expected
    assert len(tree) == 1 + len(expected)
    # prefix-closed, parents precede children, depth = parent depth + 1, scores are prefix sums
    for i in range(1, len(tree)):
        p = tree.parents[i]
        assert 0 <= p < i and tree.depths[i] == tree.depths[p] + 1
        assert abs(tree.scores[i] - (tree.scores[p] + float(lp[tree.depths[i] - 1, tree.tokens[i]]))) < 1e-5


def test_visibility_is_ancestor_only():
    lp = torch.log_softmax(torch.tensor([[3.0, 2.0, 0.0], [3.0, 1.0, 0.0]]), dim=-1)
    tree = best_first_tree(root=9, log_probs=lp, budget=4)
    vis = tree.visibility()
    for i in range(len(tree)):
        anc, j = set(), i
        while j != -1:
            anc.add(j)
            j = tree.parents[j]
        assert {j for j in range(len(tree)) if vis[i, j]} == anc


def test_chain_is_causal():
    tree = chain_tree(1, [2, 3, 4])
    assert torch.equal(tree.visibility(), torch.ones(4, 4, dtype=torch.bool).tril())
    assert tree.spine() == [0, 1, 2, 3] and tree.depths == [0, 1, 2, 3]


def test_impossible_tokens_never_enter_the_tree():
    """A reduced draft vocabulary gives -inf logits; such prefixes are not worth a node."""
    lp = torch.full((2, 6), float("-inf"))
    lp[:, 0] = 0.0
    tree = best_first_tree(root=1, log_probs=lp, budget=10)
    assert tree.prefixes() == {(0,), (0, 0)}


def test_spine_stops_before_nodes_the_drafter_finds_unlikely():
    """The walk's LM-head batch on a CPU: the best-child path, cut before a node whose prefix probability
    (relative to where the batch starts) is below the bound; without scores nothing is cut."""
    import math

    tree = chain_tree(1, [2, 3, 4], logprobs=[math.log(0.5), math.log(0.5), math.log(0.2)])  # prefixes .5 .25 .05
    assert tree.spine() == [0, 1, 2, 3]
    assert tree.spine(min_logprob=math.log(0.1)) == [0, 1, 2]
    assert tree.spine(2, math.log(0.1)) == [2, 3]  # once the walk is at node 2, node 3 is 0.2 likely
    assert chain_tree(1, [2, 3, 4]).spine(min_logprob=0.0) == [0, 1, 2, 3]
    lp = torch.log_softmax(torch.tensor([[3.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), dim=-1)
    chain = argmax_chain(5, lp)
    assert chain.tokens == [5, 0, 0] and chain.scores == pytest.approx([0.0, float(lp[0, 0]), float(lp[0, 0] + lp[1, 0])])
