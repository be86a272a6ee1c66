"""Optimisation helpers: the warmup + cosine schedule and the EMA of the weights."""

from __future__ import annotations

from contextlib import contextmanager

import torch


def make_scheduler(optimizer, total_steps: int, warmup_ratio: float, min_lr_ratio: float, lr: float):
    """Linear warmup then cosine decay to ``lr * min_lr_ratio`` (torch.optim.lr_scheduler)."""
    from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

    warm = int(round(total_steps * warmup_ratio))
    cosine = CosineAnnealingLR(optimizer, T_max=max(1, total_steps - warm), eta_min=lr * min_lr_ratio)
    if warm == 0:
        return cosine
    linear = LinearLR(optimizer, start_factor=1.0 / (warm + 1), end_factor=1.0, total_iters=warm)
    return SequentialLR(optimizer, [linear, cosine], milestones=[warm])


class EMA:
    """Exponential moving average of the trainable weights: ``avg <- decay * avg + (1 - decay) * w``.

    Written here rather than ``torch.optim.swa_utils.AveragedModel``, which deep-copies the module
    (and with it the bound target).
    """

    def __init__(self, module: torch.nn.Module, decay: float):
        self.decay = decay
        self.avg = {k: p.detach().clone() for k, p in module.named_parameters() if p.requires_grad}

    @torch.no_grad()
    def update(self, module: torch.nn.Module) -> None:
        for k, p in module.named_parameters():
            if k in self.avg:
                self.avg[k].lerp_(p.detach(), 1.0 - self.decay)

    @contextmanager
    def applied(self, module: torch.nn.Module):
        """Swap the averaged weights in for the duration of the block."""
        params = dict(module.named_parameters())
        saved = {k: params[k].detach().clone() for k in self.avg}
        with torch.no_grad():
            for k, v in self.avg.items():
                params[k].copy_(v)
        try:
            yield module
        finally:
            with torch.no_grad():
                for k, v in saved.items():
                    params[k].copy_(v)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "avg": self.avg}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state["avg"].items():
            self.avg[k].copy_(v)
