"""The objective registry: training objectives by name (``dflash``, ``eagle3``).

An objective owns everything family-specific about a training step, so the loop
(:mod:`flashdraft.train.loop`) never names a family:

* ``new_drafter(target, cfg, examples)``: a fresh drafter for this objective, shaped by the
  :class:`~flashdraft.train.config.TrainConfig` fields it reads;
* ``from_config(drafter, cfg, attention)``: the objective over ``drafter``, built from its config section;
* ``wants_final(cfg)``: whether a step needs the target's final hidden states (online or cached);
  ``feature_layer_ids(target, cfg)``: the target layers a fresh drafter reads; ``eval_method``: the
  decoding method the loop's real-decoding eval runs;
* ``blocks(batch, every_anchor)``: the micro-batch's random draws and static weights, with ``.norm`` (its
  share of the step's loss normaliser, known before any forward); ``every_anchor`` blocks at every
  position that can anchor one (the held-out decode walk);
* ``__call__(batch, blocks, normaliser, features, final_h, seed)``: a step output with a backward-ready
  ``loss``, ``correct`` [b, A, B] and ``pred`` [b, A, B] (the drafter's argmax as target ids);
* ``metrics(out, batch, blocks)``: named sum/total pairs (float64 tensors [2] or [2, n]) that ranks and
  micro-batches add up, and ``summary(sums, normaliser)``: the logged numbers from those sums (at least
  ``loss`` and ``tokens``; ``acc`` and ``tau_proxy`` show in the progress bar when present).

Register one with ``@register_objective("name")``; ``TrainConfig.objective`` picks it.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch


class Objective(Protocol):
    drafter: Any

    @classmethod
    def new_drafter(cls, target, cfg, examples) -> Any: ...

    eval_method: str

    @classmethod
    def from_config(cls, drafter, cfg, attention: str) -> "Objective": ...

    @classmethod
    def wants_final(cls, cfg) -> bool: ...

    @classmethod
    def feature_layer_ids(cls, target, cfg) -> list[int]: ...

    def blocks(self, batch, every_anchor: bool = False, evaluate: bool = False) -> Any: ...

    def __call__(self, batch, blocks, normaliser: float, features=None, final_h=None, seed: int | None = None) -> Any: ...

    def metrics(self, out, batch, blocks) -> dict[str, torch.Tensor]: ...

    def summary(self, sums: dict[str, torch.Tensor], normaliser: float) -> dict: ...


OBJECTIVES: dict[str, type] = {}


def register_objective(name: str) -> Callable[[type], type]:
    """Class decorator: ``TrainConfig.objective == name`` trains with this class."""

    def wrap(cls: type) -> type:
        OBJECTIVES[name] = cls
        cls.name = name
        return cls

    return wrap


def objective_names() -> list[str]:
    from flashdraft.train import objective, objective_dflash2, objective_eagle3  # noqa: F401  (register dflash, dflash2, eagle3)

    return sorted(OBJECTIVES)


def objective_class(name: str) -> type:
    """The objective registered as ``name``."""
    names = objective_names()
    if name not in OBJECTIVES:
        from flashdraft.train.objective import TrainError

        raise TrainError(f"unknown objective {name!r}; choose one of: {', '.join(names)} (or register one)")
    return OBJECTIVES[name]


def pair(total_sum: float, total: float) -> torch.Tensor:
    """One named metric as a sum/total pair -> float64 [2]."""
    return torch.tensor([total_sum, total], dtype=torch.float64)


def add_metrics(into: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> None:
    """Add the pairs of ``new`` to ``into`` (in place), name by name."""
    for k, v in new.items():
        into[k] = into[k] + v if k in into else v.clone()


def all_reduce_metrics(sums: dict[str, torch.Tensor], group=None) -> None:
    """Sum every pair over the ranks of ``group`` (one collective; names in sorted order on every rank)."""
    import torch.distributed as dist

    names = sorted(sums)
    flat = torch.cat([sums[k].flatten() for k in names])
    dist.all_reduce(flat, group=group)
    for k, part in zip(names, flat.split([sums[k].numel() for k in names])):
        sums[k] = part.view_as(sums[k])
