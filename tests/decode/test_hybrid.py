"""Hybrid targets (gated DeltaNet / Mamba-2 + attention): tree verification is exact for recurrent layers.

Greedy DFlash and DDTree equal the model's own ``generate`` token for token (random, oracle and
scripted drafters, budgets 1..64); each tree node's hidden state equals that of its root path run as
a plain sequence; the committed recurrent state equals a fresh prefill of the accepted text; and a
naive verifier (tree tokens fed through the recurrent layers in order) does diverge.
"""

import pytest
import torch

import flashdraft.models.recurrent as recurrent
from flashdraft.decode import build_decoder
from flashdraft.decode.speculative import DDTreeDecoder
from flashdraft.decode.tree import best_first_tree
from flashdraft.models.dflash import DFlashDrafter
from flashdraft.models.forward import compact_cache, new_cache, target_forward
from flashdraft.models.recurrent import HybridCache, RecurrentError
from tests.lossless import assert_same_tokens, top2_gap
from tests.tiny import HYBRIDS, MASK_ID, VOCAB, OracleDrafter, ScriptedDrafter, hf_greedy, random_prompts, tiny_hybrid

NEW = 30


@pytest.fixture(scope="module", params=HYBRIDS)
def target(request):
    return tiny_hybrid(request.param)


@pytest.fixture(scope="module")
def refs(target):
    prompts = random_prompts(2, 20, seed=2)
    return [(p, hf_greedy(target, p, NEW)) for p in prompts]


def test_ar_harness_matches_hf_generate(target, refs):
    for p, ref in refs:
        assert_same_tokens(target, p, build_decoder("ar", target).generate(p, NEW).tokens, ref, f"ar/{target.name}")


@pytest.mark.parametrize("method,budget", [("dflash", None), ("ddtree", 1), ("ddtree", 4), ("ddtree", 16), ("ddtree", 64)])
def test_lossless_random_and_scripted_drafters(target, refs, method, budget):
    """Random drafter: nearly every draft rejected. Scripted: partial acceptance, off-spine walks."""
    rand = DFlashDrafter.for_target(target, num_layers=1, block_size=8, mask_token_id=MASK_ID, seed=3)
    for p, ref in refs:
        for d in (rand, ScriptedDrafter(VOCAB, len(p), ref, block_size=8, corrupt_every=3)):
            res = build_decoder(method, target, d, budget=budget).generate(p, NEW)
            assert_same_tokens(target, p, res.tokens, ref, f"{method}-{budget}/{type(d).__name__}/{target.name}")


@pytest.mark.parametrize("method,budget", [("dflash", None), ("ddtree", 7), ("ddtree", 40)])
def test_oracle_drafter_full_acceptance(target, refs, method, budget):
    B = 8
    for p, ref in refs:
        res = build_decoder(method, target, OracleDrafter(target, block_size=B), budget=budget).generate(p, NEW)
        assert_same_tokens(target, p, res.tokens, ref, f"oracle-{method}/{target.name}")
        # every round accepts the whole block; the last one commits only what fits (1 token from the prefill)
        assert res.stats.taus[:-1] == [B] * (len(res.stats.taus) - 1) and sum(res.stats.taus) == NEW - 1, res.stats.taus


@torch.no_grad()
def prefill(target, ids: list[int]):
    cache = new_cache(target)
    n = len(ids)
    hidden, _ = target_forward(target, cache, torch.tensor(ids), torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril())
    return cache, hidden


def test_every_node_sees_its_own_path_only(target):
    """Node i's hidden state == the last hidden state of prompt + (root .. i) run as a plain sequence."""
    prompt = random_prompts(1, 12, seed=7)[0]
    lp = torch.log_softmax(torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(1)) * 3, -1)
    tree = best_first_tree(5, lp, 24)
    cache, _ = prefill(target, prompt)
    past = len(prompt)
    hidden, _ = target_forward(target, cache, torch.tensor(tree.tokens), past + torch.tensor(tree.depths),
                               tree.visibility(), tree_parents=tree.parents)
    assert len(set(tree.depths)) > 2 and len(tree) - 1 > max(tree.depths)  # a real tree: branches and depth
    for i in range(len(tree)):
        path, j = [], i
        while j != -1:
            path.append(tree.tokens[j])
            j = tree.parents[j]
        _, ref = prefill(target, prompt + path[::-1])
        # a leak from another branch moves the state by O(0.1); the chunked vs stepwise recurrences differ by
        # up to ~2e-4 in summation order (seen on an Intel Xeon)
        torch.testing.assert_close(hidden[i], ref[-1], atol=1e-3, rtol=1e-3)


def test_committed_state_equals_prefill_of_accepted_text(target):
    prompt = random_prompts(1, 12, seed=8)[0]
    lp = torch.log_softmax(torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(2)) * 3, -1)
    tree = best_first_tree(9, lp, 20)
    node = max(range(len(tree)), key=lambda i: (tree.depths[i], i))  # a deep node late in pop order
    path = [node]
    while tree.parents[path[-1]] != -1:
        path.append(tree.parents[path[-1]])
    path = path[::-1]
    assert path != list(range(len(path)))  # off the insertion order: siblings come before it
    cache, _ = prefill(target, prompt)
    past = len(prompt)
    target_forward(target, cache, torch.tensor(tree.tokens), past + torch.tensor(tree.depths), tree.visibility(),
                   tree_parents=tree.parents)
    compact_cache(cache, past, torch.tensor(path))
    ref, _ = prefill(target, prompt + [tree.tokens[i] for i in path])
    assert cache.get_seq_length() == ref.get_seq_length() == past + len(path)
    for i in cache.recurrent_ids:
        torch.testing.assert_close(cache.layers[i].recurrent_states[0], ref.layers[i].recurrent_states[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(cache.layers[i].conv_states[0], ref.layers[i].conv_states[0], atol=1e-4, rtol=1e-4)
    for i, layer in enumerate(cache.layers):
        if getattr(layer, "keys", None) is not None:
            torch.testing.assert_close(layer.keys, ref.layers[i].keys, atol=1e-5, rtol=1e-4)


class NaiveTreeDecoder(DDTreeDecoder):
    """The mistake this module guards against: the recurrent layers read the tree tokens in order."""

    def recurrent_parents(self, tree):
        return list(range(-1, len(tree) - 1))


def test_naive_recurrent_verifier_diverges(target, refs, monkeypatch):
    monkeypatch.setattr(recurrent, "check_root_path", lambda parents, keep: None)  # naive: accept any kept set
    diverged = 0
    for p, ref in refs:
        drafter = ScriptedDrafter(VOCAB, len(p), ref, block_size=8, corrupt_every=3)
        got = NaiveTreeDecoder(target, drafter, budget=16).generate(p, NEW).tokens
        exact = build_decoder("ddtree", target, drafter, budget=16).generate(p, NEW).tokens
        assert_same_tokens(target, p, exact, ref, f"exact/{target.name}")
        if got != ref:
            i = next(k for k in range(NEW) if got[k] != ref[k])
            assert top2_gap(target, p + ref[:i]) > 1e-3  # a real divergence, not a numerical near-tie
            diverged += 1
    assert diverged >= 1


def test_hybrid_misuse_is_refused(target):
    prompt = random_prompts(1, 6, seed=9)[0]
    n = len(prompt)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    with pytest.raises(RecurrentError, match="new_cache\\(target\\)"):
        target_forward(target, new_cache(), torch.tensor(prompt), torch.arange(n), causal)
    cache, _ = prefill(target, prompt)
    tree = best_first_tree(1, torch.log_softmax(torch.randn(3, VOCAB), -1), 6)
    ids, pos, vis = torch.tensor(tree.tokens), n + torch.tensor(tree.depths), tree.visibility()
    with pytest.raises(RecurrentError, match="tree_parents"):
        target_forward(target, cache, ids, pos, vis)
    assert isinstance(cache, HybridCache)
    target_forward(target, cache, ids, pos, vis, tree_parents=tree.parents)
    with pytest.raises(RecurrentError, match="root path"):
        compact_cache(cache, n, torch.tensor([0, 2]) if tree.parents[2] != 0 else torch.tensor([1]))


def test_unsupported_recurrent_family_is_named():
    from transformers import FalconH1Config

    cfg = FalconH1Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    with pytest.raises(RecurrentError, match="falcon_h1.*supported hybrids"):
        recurrent.recurrent_family(cfg)


def test_qwen3_5_moe_hybrid_is_lossless():
    """The MoE variant registers the same gated-DeltaNet tree path: check it on a tiny random model."""
    from transformers import AutoModelForCausalLM, Qwen3_5MoeTextConfig

    from flashdraft.models.target import wrap_model

    cfg = Qwen3_5MoeTextConfig(
        vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"], num_hidden_layers=4,
        linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
        linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, initializer_range=0.3, tie_word_embeddings=False, eos_token_id=None,
        bos_token_id=None, pad_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        target = wrap_model(AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32), name="moe")
    p = random_prompts(1, 16, seed=1)[0]
    ref = hf_greedy(target, p, 24)
    for method, budget in [("dflash", None), ("ddtree", 16)]:
        got = build_decoder(method, target, ScriptedDrafter(VOCAB, len(p), ref, 8, 3), budget=budget).generate(p, 24).tokens
        assert_same_tokens(target, p, got, ref, f"qwen3_5_moe/{method}")
