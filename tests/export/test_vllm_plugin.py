"""flashdraft's vLLM plugin on its own (no engine): the histories it rebuilds from what vLLM's DFlash proposer
is given, the hints it writes, and when it acts. ``test_vllm_serve.py`` checks it inside the real engine."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from flashdraft.decode.lookup import lookup_hints
from flashdraft.export.vllm_plugin import ENV, request_histories, wants_hints

MASK = 99


def test_histories_join_the_host_copy_the_step_s_accepted_tokens_and_the_bonus():
    # request 0 committed [5, 6, 7, 8] before this step (positions 0-3), then verified [8, 1, 2] at positions 3-5 with
    # one draft rejected (8 and 1 stand), bonus 3; request 1: a prefill of [4, 4, 4] at positions 0-2, bonus 9.
    # The host copy lags: request 0's row holds stale values past position 3 (what vLLM fills in after proposing).
    committed = np.zeros((2, 16), dtype=np.int32)
    committed[0, :6] = [5, 6, 7, 8, 77, 77]
    step = torch.tensor([8, 1, 2, 4, 4, 4])
    pos = torch.tensor([3, 4, 5, 0, 1, 2])
    got = request_histories(committed, step, pos, torch.tensor([3, 9]), torch.tensor([0, 3, 6]), torch.tensor([1, 0]))
    assert [h.tolist() for h in got] == [[5, 6, 7, 8, 1, 3], [4, 4, 4, 9]]
    # M-RoPE positions [3, T] read the first row; no rejected counts (a first pass) keep every token
    got = request_histories(committed, step, pos.expand(3, -1), torch.tensor([3, 9]), torch.tensor([0, 3, 6]), None)
    assert [h.tolist() for h in got] == [[5, 6, 7, 8, 1, 2, 3], [4, 4, 4, 9]]


def test_the_hints_are_flashdraft_s_for_that_history():
    h = torch.tensor([1, 2, 3, 4, 1, 2])
    assert lookup_hints(h, 3, MASK).tolist() == [3, 4, 1]  # what the plugin writes after bonus 2
    assert lookup_hints(torch.tensor([1, 2, 3]), 3, MASK).tolist() == [MASK] * 3


def test_it_acts_only_for_a_hinted_drafter(monkeypatch):
    assert wants_hints(SimpleNamespace(block_hints="lookup"))
    assert not wants_hints(SimpleNamespace(block_hints=None)) and not wants_hints(SimpleNamespace())
    monkeypatch.setenv(ENV, "0")
    assert not wants_hints(SimpleNamespace(block_hints="lookup"))
