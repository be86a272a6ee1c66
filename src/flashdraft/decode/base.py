"""The decoder interface, generation statistics and the registry of decoding methods."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable, ClassVar

from flashdraft.errors import FlashdraftError

STAGES = ("prefill", "draft", "tree_build", "verify", "commit")


class DecodeError(FlashdraftError, ValueError):
    """Bad decoding input; the message names the argument and the fix."""


@dataclass
class DecodeStats:
    """Per-generation statistics. A round's tau = the tokens it committed to the output (accepted drafts + bonus,
    the last round cut at ``max_new_tokens`` and at a stop token), so ``tau_mean`` = new tokens from verify
    rounds / rounds, never more than what was emitted."""

    method: str
    prompt_tokens: int = 0
    new_tokens: int = 0
    max_depth: int = 0  # deepest draft position a round could accept (B - 1 for DFlash; 0 for AR)
    taus: list[int] = field(default_factory=list)
    # drafts the verifier accepted each round before the output was cut: what an engine's spec-decode counters
    # (vLLM's num_accepted_tokens) count, for comparing acceptance rates with them; tau never uses it
    accepted: list[int] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    total_seconds: float = 0.0

    @property
    def rounds(self) -> int:
        return len(self.taus)

    @property
    def tau_mean(self) -> float:
        return sum(self.taus) / len(self.taus) if self.taus else 0.0

    def tau_histogram(self) -> dict[int, int]:
        """Rounds per tau value 1 .. max_depth + 1."""
        counts = Counter(self.taus)
        return {t: counts.get(t, 0) for t in range(1, self.max_depth + 2)}

    def per_position_acceptance(self) -> list[float]:
        """Entry k-1: the share of rounds whose draft position k was accepted (tau >= k + 1)."""
        if not self.taus:
            return [0.0] * self.max_depth
        return [sum(t >= k + 1 for t in self.taus) / len(self.taus) for k in range(1, self.max_depth + 1)]

    @property
    def decode_seconds(self) -> float:
        return self.total_seconds - self.stage_seconds["prefill"]

    @property
    def tokens_per_second(self) -> float:
        """New tokens over decode time (prefill excluded; the first token comes from the prefill)."""
        return (self.new_tokens - 1) / self.decode_seconds if self.new_tokens > 1 and self.decode_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            rounds=self.rounds,
            tau_mean=self.tau_mean,
            tau_histogram=self.tau_histogram(),
            per_position_acceptance=self.per_position_acceptance(),
            tokens_per_second=self.tokens_per_second,
        )
        return d


@dataclass
class Generation:
    tokens: list[int]  # new tokens only (the prompt excluded), up to and including a stop token
    stats: DecodeStats


class Decoder(ABC):
    """prompt ids, max new tokens, temperature, seed -> tokens + stats."""

    method: ClassVar[str]
    needs_drafter: ClassVar[bool] = True
    uses_budget: ClassVar[bool] = True  # whether ``budget`` sizes its rounds
    OPTIONS: ClassVar[tuple[str, ...]] = ()  # keyword options ``create`` takes besides target, drafter and budget

    @abstractmethod
    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0, seed: int = 0) -> Generation:
        ...


DECODERS: dict[str, Callable[..., Decoder]] = {}


def register(name: str):
    """Class decorator adding a decoder to :data:`DECODERS` under ``name``."""

    def wrap(cls):
        cls.method = name
        DECODERS[name] = cls
        return cls

    return wrap


def unused_settings(method: str, names) -> list[str]:
    """Of the decode settings ``names`` (drafter, budget and method options) those ``method`` does not use, so
    that a command can say it ignores them."""
    cls = DECODERS[method]
    used = set(cls.OPTIONS) | ({"drafter"} if cls.needs_drafter else set()) | ({"budget"} if cls.uses_budget else set())
    return sorted(n for n in names if n not in used)


def build_decoder(method: str, target, drafter=None, budget: int | None = None, **options) -> Decoder:
    """The decoder registered as ``method`` for ``target`` (and ``drafter`` / tree ``budget`` where used, and the
    method's own ``options``, e.g. ``lookup_min`` for prompt lookup); the methods are registered by importing
    :mod:`flashdraft.decode`, which every import of this module does."""
    if method not in DECODERS:
        raise DecodeError(f"unknown decoding method {method!r}; choose one of: {', '.join(sorted(DECODERS))}")
    cls = DECODERS[method]
    bad = sorted(set(options) - set(cls.OPTIONS))
    if bad:
        takes = ", ".join(cls.OPTIONS) or "none"
        raise DecodeError(f"method {method!r} has no option {', '.join(bad)} (its options: {takes}); drop it")
    return cls.create(target, drafter=drafter, budget=budget, **options)
