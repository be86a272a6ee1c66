"""Optimisation helpers: the optimizer (AdamW, or Muon + AdamW), the warmup + cosine schedule and the EMA of the
weights."""

from __future__ import annotations

from contextlib import contextmanager

import torch


# Weights Muon leaves to AdamW though they are matrices: tables indexed by token id (Muon orthogonalises updates of
# hidden-layer matrices; speculators' rule)
NOT_MUON = ("embed_tokens", "lm_head", "codebook")


class MuonAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` on the drafter's hidden 2-D weight matrices and ``torch.optim.AdamW`` on everything else
    (norms, biases, vectors, token tables), stepped, scheduled and checkpointed as one optimizer: its
    ``param_groups`` are the two optimizers' own, so a scheduler sets both learning rates. Muon's settings are
    speculators 0.9's defaults: momentum 0.95, weight decay 0.1, 5 Newton-Schulz steps, its update scaled to
    AdamW's RMS (``match_rms_adamw``), so one learning rate serves both."""

    def __init__(self, named_params, lr: float, betas: tuple[float, float], weight_decay: float):
        named = [(n, p) for n, p in named_params if p.requires_grad]
        matrices = [p for n, p in named if p.ndim == 2 and min(p.shape) > 1 and not any(h in n for h in NOT_MUON)]
        rest = [p for n, p in named if not any(p is m for m in matrices)]
        super().__init__([{"params": matrices}, {"params": rest}], {"lr": lr})
        self.muon = torch.optim.Muon(matrices, lr=lr, momentum=0.95, weight_decay=0.1, ns_steps=5,
                                     adjust_lr_fn="match_rms_adamw")
        self.adamw = torch.optim.AdamW(rest, lr=lr, betas=betas, weight_decay=weight_decay)
        self.param_groups = self.muon.param_groups + self.adamw.param_groups

    @torch.no_grad()
    def step(self, closure=None):
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"muon", "adamw"}:
            raise ValueError(f"not a Muon + AdamW state (keys {sorted(state)[:4]}); resume with the optimizer it was saved with")
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])
        self.param_groups = self.muon.param_groups + self.adamw.param_groups  # loading made new group dicts


def make_optimizer(module: torch.nn.Module, kind: str, lr: float, betas: tuple[float, float], weight_decay: float):
    """``kind`` "adamw": AdamW over the trainable weights; "muon": :class:`MuonAdamW`."""
    if kind == "muon":
        return MuonAdamW(module.named_parameters(), lr, betas, weight_decay)
    params = [p for p in module.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)


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
