"""The CPU LM-head path: every kernel computes head(hidden), the fastest one is measured once and kept."""

import time

import pytest
import torch
from torch import nn

from flashdraft.models import forward
from flashdraft.models.forward import HEAD_KERNELS, head_kernel, head_rows


@pytest.fixture
def head():
    torch.manual_seed(0)
    return nn.Linear(32, 1000, bias=False).requires_grad_(False)


@pytest.mark.parametrize("name", list(HEAD_KERNELS))
@pytest.mark.parametrize("m", [1, 3, 8])
def test_every_kernel_computes_the_head(head, name, m):
    h = torch.randn(m, 32)
    out = HEAD_KERNELS[name](head, h)
    assert out.shape == (m, 1000) and out.is_contiguous()
    torch.testing.assert_close(out, head(h), rtol=1e-5, atol=1e-5)


def test_the_fastest_kernel_is_measured_once_per_row_bucket_and_kept(head, monkeypatch):
    calls = {"slow": 0, "fast": 0}

    def slow(hd, h):
        calls["slow"] += 1
        time.sleep(0.01)
        return h @ hd.weight.T

    def fast(hd, h):
        calls["fast"] += 1
        return h @ hd.weight.T

    monkeypatch.setattr(forward, "HEAD_KERNELS", {"slow": slow, "fast": fast})
    monkeypatch.setattr(forward, "_HEAD_PLAN", {})
    assert head_kernel(head, 3, torch.float32) == "fast"  # 3 rows: measured on the bucket of 4
    measured = dict(calls)
    assert measured == {"slow": 4, "fast": 4}  # a warm-up and 3 timed runs each
    assert head_kernel(head, 4, torch.float32) == "fast" and calls == measured  # same bucket: kept
    head_rows(head, torch.randn(4, 32))
    assert calls == {"slow": 4, "fast": 5}  # the kept kernel computes the rows
    head_kernel(head, 5, torch.float32)
    assert calls["slow"] == 8  # a new bucket (8 rows) is measured
    twin = nn.Linear(32, 1000, bias=False)
    assert head_kernel(twin, 8, torch.float32) == "fast" and calls["slow"] == 8  # same shape: kept


def test_gradient_reaches_the_rows_through_a_frozen_head(head):
    h = torch.randn(2, 32, requires_grad=True)
    head_rows(head, h).sum().backward()
    torch.testing.assert_close(h.grad, head.weight.sum(0).expand(2, -1))
