"""At T = 1 every emitted token is an exact target sample: chi-square against AR and the exact law."""

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency, chisquare

from flashdraft.decode import build_decoder
from tests.tiny import OracleDrafter, tiny_target

VOCAB = 10
DRAWS = 2000
PROMPT = [3, 1, 4, 1, 5]
P_MIN = 1e-3  # fixed seeds make every p-value deterministic; this only guards against a wrong law


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3", vocab_size=VOCAB, num_hidden_layers=2, seed=11)


@torch.no_grad()
def exact_second_token_law(target) -> np.ndarray:
    """P(2nd new token = y) = sum_x p(x | prompt) p(y | prompt, x), from the target's logits at T = 1."""
    m = target.model
    p1 = torch.softmax(m(torch.tensor([PROMPT])).logits[0, -1], -1)  # [V]
    seqs = torch.tensor([PROMPT + [x] for x in range(VOCAB)])
    p2 = torch.softmax(m(seqs).logits[:, -1], -1)  # [V, V]
    law = (p1[:, None] * p2).sum(0).double().numpy()
    return law / law.sum()


def second_tokens(dec) -> np.ndarray:
    counts = np.zeros(VOCAB, dtype=np.int64)
    for seed in range(DRAWS):
        counts[dec.generate(PROMPT, 2, temperature=1.0, seed=seed).tokens[1]] += 1
    return counts


def merged(counts: np.ndarray, expected: np.ndarray):
    keep = expected >= 5  # chi-square needs >= 5 expected per cell: merge the rare ones into one cell
    c = np.append(counts[keep], counts[~keep].sum())
    e = np.append(expected[keep], expected[~keep].sum())
    return (c, e) if e[-1] > 0 else (c[:-1], e[:-1])


def test_speculative_sampling_matches_ar_and_exact_law(target):
    law = exact_second_token_law(target)
    ar = second_tokens(build_decoder("ar", target))
    c, e = merged(ar, law * DRAWS)
    assert chisquare(c, e).pvalue > P_MIN
    for method in ("dflash", "ddtree"):
        dec = build_decoder(method, target, OracleDrafter(target, block_size=4), budget=6)
        counts = second_tokens(dec)
        c, e = merged(counts, law * DRAWS)
        assert chisquare(c, e).pvalue > P_MIN, (method, counts, law * DRAWS)
        cols = law * DRAWS >= 5
        table = np.stack([np.append(ar[cols], ar[~cols].sum()), np.append(counts[cols], counts[~cols].sum())])
        table = table[:, table.sum(0) > 0]
        assert chi2_contingency(table).pvalue > P_MIN, (method, table)


def test_sampling_is_reproducible_by_seed(target):
    dec = build_decoder("ddtree", target, OracleDrafter(target, block_size=4), budget=6)
    a = dec.generate(PROMPT, 12, temperature=0.8, seed=5).tokens
    assert a == dec.generate(PROMPT, 12, temperature=0.8, seed=5).tokens
    assert any(dec.generate(PROMPT, 12, temperature=0.8, seed=s).tokens != a for s in range(6, 12))


def test_acceptance_happens_at_t1(target):
    """The chi-square test above is only meaningful if drafts are accepted (not only rejected)."""
    dec = build_decoder("dflash", target, OracleDrafter(target, block_size=4))
    taus = [t for s in range(20) for t in dec.generate(PROMPT, 12, temperature=1.0, seed=s).stats.taus]
    assert max(taus) >= 3 and sum(t > 1 for t in taus) / len(taus) > 0.2
