"""Domain label sets and target mixes: parsing and validation with errors that say how to fix them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from flashdraft.errors import FlashdraftError

DEFAULT_DOMAINS: tuple[str, ...] = ("coding", "math", "general", "tool_calling", "agent", "translation", "other")

# How close to 1 the shares of a target mix must add up.
SUM_TOLERANCE = 1e-3


class MixError(FlashdraftError, ValueError):
    """Input that `flashdraft mix` cannot use; the message names the thing and the fix."""


@dataclass(slots=True)
class Label:
    """A domain and the signals (name -> value) that decided it (what every classifier returns)."""

    domain: str
    rule: str
    signals: dict[str, float | int | str] = field(default_factory=dict)


def check_labels(labels: Iterable[str]) -> tuple[str, ...]:
    """Validate a label set: non-empty, unique, identifier-like names."""
    out = tuple(str(x).strip() for x in labels)
    if not out:
        raise MixError("the label set is empty; give at least one domain, e.g. --labels coding,general")
    bad = [x for x in out if not x or not x.replace("_", "").replace("-", "").isalnum()]
    if bad:
        raise MixError(f"invalid domain name(s) {bad}: use letters, digits, '_' or '-' only")
    dup = sorted({x for x in out if out.count(x) > 1})
    if dup:
        raise MixError(f"domain name(s) {dup} appear more than once in the label set; list each once")
    return out


def parse_mix(spec: str | Mapping[str, float], labels: Iterable[str] = DEFAULT_DOMAINS) -> dict[str, float]:
    """Parse ``"coding=0.46,general=0.26,..."`` (or a mapping) into validated shares that sum to 1.

    Shares may be given as fractions or percentages (``coding=46,...`` summing to 100). Every name
    must be in ``labels``; domains left out get share 0.
    """
    labels = check_labels(labels)
    if isinstance(spec, Mapping):
        items = [(str(k).strip(), v) for k, v in spec.items()]
    else:
        text = str(spec).strip()
        if not text:
            raise MixError("the target mix is empty; write it as coding=0.46,general=0.26,math=0.11,...")
        items = []
        for part in text.split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise MixError(f"cannot read {part.strip()!r} in the target mix: write each entry as domain=share")
            k, v = part.split("=", 1)
            items.append((k.strip(), v.strip()))
    shares: dict[str, float] = {}
    for name, value in items:
        if name not in labels:
            raise MixError(
                f"unknown domain {name!r} in the target mix; known domains: {', '.join(labels)} "
                "(fix the spelling, or add it to the label set with --labels)"
            )
        if name in shares:
            raise MixError(f"domain {name!r} is given twice in the target mix; give each domain once")
        try:
            share = float(value)
        except (TypeError, ValueError):
            raise MixError(f"share of {name!r} is {value!r}, not a number; write e.g. {name}=0.25") from None
        if share < 0 or share != share:
            raise MixError(f"share of {name!r} is {value}; shares must be >= 0")
        shares[name] = share
    total = sum(shares.values())
    if abs(total - 100.0) <= 100 * SUM_TOLERANCE and total > 1.5:
        shares = {k: v / 100.0 for k, v in shares.items()}
        total = sum(shares.values())
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise MixError(
            f"target shares sum to {total:.4g}, not 1 (or 100%): {format_mix(shares)}; "
            "adjust them so they add up to 1, e.g. put the remainder on 'other'"
        )
    return {k: shares.get(k, 0.0) / total for k in labels}


def format_mix(shares: Mapping[str, float]) -> str:
    """Render shares as ``coding=46.0%, general=26.0%`` (zero shares omitted)."""
    return ", ".join(f"{k}={v * 100:.1f}%" for k, v in shares.items() if v > 0) or "(empty)"
