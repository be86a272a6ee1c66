"""The serve tests' output comparison: equal outputs pass, a parting at a non-tie is caught."""

from __future__ import annotations

import pytest
import torch

from tests.export.near_tie import NEAR_TIE, assert_equal_up_to_near_ties
from tests.tiny import random_prompts, tiny_target


@torch.no_grad()
def test_equal_outputs_pass_and_a_real_divergence_is_caught():
    target = tiny_target("qwen3")
    prompt = random_prompts(1, 8, seed=4)[0]
    logits = target.model(torch.tensor(prompt)[None]).logits[0, -1]
    best, worst = int(logits.argmax()), int(logits.argmin())
    assert float(logits[best] - logits[worst]) > NEAR_TIE  # else the case below is no divergence
    assert assert_equal_up_to_near_ties(target, [prompt], [[best, 3]], [[best, 3]]) == [None]
    with pytest.raises(AssertionError, match="no near-tie"):
        assert_equal_up_to_near_ties(target, [prompt], [[worst, 3]], [[best, 3]])
