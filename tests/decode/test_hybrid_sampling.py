"""At T = 1 a hybrid target's speculative samples follow the exact law (chi-square), chain and tree."""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from flashdraft.decode import build_decoder
from tests.decode.test_sampling import P_MIN, PROMPT, VOCAB, exact_second_token_law, merged
from tests.tiny import HYBRIDS, tiny_hybrid

DRAWS = 250
LAYERS = {
    "qwen3_5": dict(layer_types=["linear_attention", "full_attention", "linear_attention"]),
    "nemotron_h": dict(layers_block_type=["linear_attention", "full_attention", "linear_attention"]),
}


class LawDrafter:
    """Proposes the target's own first-token law at depth 1 and its likeliest second tokens at depth 2
    (computed once for the fixed prompt): drafts are often accepted at T = 1, siblings cover the rest."""

    target_layer_ids: list[int] = []
    max_depth = 2  # two draft positions

    def __init__(self, target):
        m = target.model
        with torch.no_grad():
            p1 = torch.log_softmax(m(torch.tensor([PROMPT])).logits[0, -1], -1)  # [V]
            nxt = torch.log_softmax(m(torch.tensor([PROMPT + [int(p1.argmax())]])).logits[0, -1], -1)
        self.logits = torch.stack([p1, nxt])  # [2, V]

    def reset(self) -> None:
        pass

    def propose(self, tokens, new_features):
        return self.logits


def second_tokens(dec) -> np.ndarray:
    counts = np.zeros(VOCAB, dtype=np.int64)
    for seed in range(DRAWS):
        counts[dec.generate(PROMPT, 2, temperature=1.0, seed=seed).tokens[1]] += 1
    return counts


@pytest.mark.parametrize("family,method", [("qwen3_5", "dflash"), ("qwen3_5", "ddtree"), ("nemotron_h", "ddtree")])
def test_hybrid_sampling_matches_exact_law(family, method):
    assert family in HYBRIDS
    target = tiny_hybrid(family, vocab_size=VOCAB, seed=11, **LAYERS[family])
    law = exact_second_token_law(target)
    assert np.count_nonzero(law * DRAWS >= 5) >= 3  # a law with several likely tokens, not a point mass
    dec = build_decoder(method, target, LawDrafter(target), budget=6)
    counts = second_tokens(dec)
    c, e = merged(counts, law * DRAWS)
    assert chisquare(c, e).pvalue > P_MIN, (family, method, counts, law * DRAWS)
    taus = [dec.generate(PROMPT, 3, temperature=1.0, seed=s).stats.taus[0] for s in range(20)]
    assert max(taus) >= 2  # drafts were accepted: the test covers the walk, not only rejections
