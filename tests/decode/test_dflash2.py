"""DFlash2 decoding: greedy chain and tree output equals AR token for token (random drafters, and a drafter whose
selector is scripted to name the target's own continuation); the chain is the selector's left-to-right pick; the
tree is exactly the top-``budget`` prefixes under the per-parent score."""

import itertools

import pytest
import torch

from flashdraft.decode import build_decoder
from flashdraft.decode.tree import best_first_tree_by
from flashdraft.models.dflash import DFlash2Drafter
from tests.lossless import assert_same_tokens
from tests.tiny import MASK_ID, VOCAB, hf_greedy, random_prompts, tiny_target

NEW = 40


def drafter(target, B=8, seed=3, **kw):
    return DFlash2Drafter.for_target(target, num_layers=2, block_size=B, mask_token_id=MASK_ID, seed=seed,
                                     conv_group_size=8, selector_rank=16, selector_top_k=8, **kw)


@pytest.fixture(scope="module", params=["qwen3", "gemma3", "llama"])
def target(request):
    return tiny_target(request.param)


@pytest.mark.parametrize("method,budget", [("dflash", None), ("ddtree", 4), ("ddtree", 48)])
def test_random_dflash2_is_lossless(target, method, budget):
    d = drafter(target)
    with torch.no_grad():  # convolutions and selector away from their identity / fresh init
        for name, p in d.named_parameters():
            if "conv" in name or "selector" in name:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.5)
    ar = build_decoder("ar", target)
    dec = build_decoder(method, target, d, budget=budget)
    for p in random_prompts(3, 20, seed=2):
        res = dec.generate(p, NEW)
        assert_same_tokens(target, p, res.tokens, ar.generate(p, NEW).tokens, f"dflash2-{method}/{target.name}")
        assert len(res.tokens) == NEW


def scripted(d: DFlash2Drafter, full: list[int]) -> None:
    """Script ``d``'s selector with ``full`` (prompt + the target's continuation): in the block after position s,
    slot k's candidate full[s + k] scores 100 above the rest whenever the token before it is full[s + k - 1]; the
    unary head and the network stay random. Every candidate is the whole vocabulary (selector_top_k = VOCAB)."""
    own = d.propose_candidates

    def propose_candidates(tokens, feats, hints=None):
        cand = own(tokens, feats, hints)
        s = tokens.shape[0]  # position of slot 1's token

        def scores(k, prev):
            out = torch.zeros(cand.cols.shape[1])
            if s + k < len(full) and prev == full[s + k - 1]:
                out[(cand.cols[k] == full[s + k]).nonzero()[0]] = 100.0
            return out

        cand.scores = scores
        return cand

    d.propose_candidates = propose_candidates


@pytest.mark.parametrize("method,budget", [("dflash", None), ("ddtree", 12)])
def test_scripted_selector_is_accepted_whole(target, method, budget):
    """A selector that names the target's own continuation after the right predecessor: every round is accepted
    whole, by the chain and by the tree built from per-parent scores, and the output is AR's."""
    B = 8
    d = DFlash2Drafter.for_target(target, num_layers=1, block_size=B, mask_token_id=MASK_ID, seed=3,
                                  conv_group_size=8, selector_rank=16, selector_top_k=VOCAB)
    for p in random_prompts(2, 12, seed=4):
        cont = hf_greedy(target, p, NEW)
        scripted(d, p + cont)
        res = build_decoder(method, target, d, budget=budget).generate(p, NEW)
        assert_same_tokens(target, p, res.tokens, cont, f"scripted-dflash2-{method}/{target.name}")
        assert res.stats.taus[:-1] == [B] * (len(res.stats.taus) - 1), res.stats.taus


@torch.no_grad()
def test_chain_is_the_selectors_left_to_right_pick():
    torch.manual_seed(0)
    target = tiny_target("qwen3")
    d = drafter(target)
    torch.nn.init.normal_(d.candidate_selector.predecessor_codebook, std=2.0)
    torch.nn.init.normal_(d.candidate_selector.successor_codebook, std=2.0)
    torch.nn.init.normal_(d.candidate_selector.hidden_projection.weight, std=1.0)
    ids = torch.tensor(random_prompts(1, 10, seed=1)[0])
    feats = torch.randn(9, len(d.target_layer_ids) * 32)
    d.reset()
    scores, cols = d.propose_scores(ids, feats)
    d.reset()
    cand = d.propose_candidates(ids, feats)
    prev = int(ids[-1])
    for k in range(d.max_depth):
        want = cand.scores(k, prev)
        assert torch.equal(scores[k, cand.cols[k]], want)
        assert torch.isinf(scores[k]).sum() == VOCAB - d.top_k  # only the K candidates can be drafted
        prev = cand.token(k, int(want.argmax()))
        assert int(scores[k].argmax()) == prev
    changed = sum(int(cand.top[k].argmax()) != int(cand.scores(k, int(ids[-1])).argmax()) for k in range(d.max_depth))
    assert changed > 0  # the selector changes some pick (else the test would not tell the selector from the unary)


@torch.no_grad()
def test_tree_is_the_top_budget_prefixes_under_the_per_parent_score():
    torch.manual_seed(0)
    target = tiny_target("llama")
    d = DFlash2Drafter.for_target(target, num_layers=1, block_size=4, mask_token_id=MASK_ID, seed=5,
                                  conv_group_size=8, selector_rank=16, selector_top_k=4)
    torch.nn.init.normal_(d.candidate_selector.predecessor_codebook, std=2.0)
    torch.nn.init.normal_(d.candidate_selector.successor_codebook, std=2.0)
    torch.nn.init.normal_(d.candidate_selector.hidden_projection.weight, std=1.0)
    ids = torch.tensor(random_prompts(1, 10, seed=6)[0])
    cand = d.propose_candidates(ids, torch.randn(9, len(d.target_layer_ids) * 32))
    L, K = cand.top.shape

    def logp(k, prev):
        return torch.log_softmax(cand.scores(k, prev), dim=-1)

    every = {}  # every prefix (as candidate ranks) -> (tokens, score)
    for depth in range(1, L + 1):
        for ranks in itertools.product(range(K), repeat=depth):
            prev, toks, score = cand.bonus, [], 0.0
            for k, j in enumerate(ranks):
                score += float(logp(k, prev)[j])
                prev = cand.token(k, j)
                toks.append(prev)
            every[ranks] = (tuple(toks), score)
    for budget in (1, 5, 17, 40):
        tree = best_first_tree_by(cand.bonus, cand.children(), L, budget)
        best = sorted(every.values(), key=lambda ts: -ts[1])[:budget]
        assert tree.prefixes() == {t for t, _ in best}
        for i in range(1, len(tree)):  # the heap's scores are the prefix scores
            path, node = [], i
            while node:
                path.append(tree.tokens[node])
                node = tree.parents[node]
            assert abs(tree.scores[i] - dict(every.values())[tuple(reversed(path))]) < 1e-4
