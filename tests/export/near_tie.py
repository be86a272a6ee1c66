"""Greedy outputs of two bf16 engines compared up to floating-point near-ties.

vLLM verifies a speculative round as a block of tokens, plain decoding one token at a time; in bf16 the
two batch shapes round differently, so where the target's top two logits nearly tie the two runs can
pick different tokens and then continue differently (seen on an Intel Xeon: fp32 logits 22.549 vs
22.527, bf16 ranks them the other way; on an AMD EPYC with AVX512-BF16, whose bf16 kernels round
differently again, two tokens 0.263 apart in fp32). Equal outputs, or equal up to a position that is such a tie,
is what "the speculative output is the target's own greedy output" can mean in bf16.
"""

from __future__ import annotations

import torch

NEAR_TIE = 0.5  # logits: four bf16 steps at the magnitude of Gemma-3-270M's top logits (16-32)


@torch.no_grad()
def assert_equal_up_to_near_ties(target, prompts: list[list[int]], spec: list[list[int]], plain: list[list[int]]):
    """spec == plain token for token, except that each pair may part at one position where both tokens'
    logits under ``target`` (fp32) lie within :data:`NEAR_TIE` of the top logit; returns the parting
    positions (None where the outputs are equal)."""
    parted = []
    for p, a, b in zip(prompts, spec, plain, strict=True):
        i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if i is None:
            assert len(a) == len(b), (len(a), len(b))
            parted.append(None)
            continue
        logits = target.model(torch.tensor(p + a[:i])[None]).logits[0, -1].float()
        top = float(logits.max())
        gap = {tok: top - float(logits[tok]) for tok in (a[i], b[i])}
        assert max(gap.values()) <= NEAR_TIE, (
            f"outputs part at new token {i} where the target has no near-tie: distance of each token's logit "
            f"from the top one {gap} (a real divergence, not rounding)")
        parted.append(i)
    return parted
