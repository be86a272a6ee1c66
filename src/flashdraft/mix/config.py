"""The `mix` section of the flashdraft config (YAML ``--config``; flags override single fields)."""

from __future__ import annotations

from pydantic import Field, field_validator

from flashdraft.config import Section
from flashdraft.mix.domains import DEFAULT_DOMAINS, check_labels


class MixConfig(Section):
    """Options shared by `flashdraft mix report|plan|rebalance`."""

    labels: list[str] = Field(default_factory=lambda: list(DEFAULT_DOMAINS),
                              description="domain label set; rules for a missing label are skipped")
    method: str = Field("learned", description="'learned' (linear head over signals and tokens, the default), "
                        "'rules' (transparent signals only) or 'embedding' (sentence-embedding head)")
    model: str | None = Field(None, description="head (.npz): a learned head (default: the shipped one) or an "
                              "embedding head for method=embedding")
    abstain_below: float = Field(0.0, ge=0, lt=1, description="learned: label 'other' when the top probability "
                                 "is below this (0 = never abstain)")
    keyword_labels: dict[str, list[str]] = Field(
        default_factory=dict, description="extra labels decided by regex keywords, checked before the rules")
    examples: int = Field(5, ge=0, description="random examples per domain in the report")
    seed: int = 0
    batch_size: int = Field(4096, ge=1)
    workers: int = Field(1, ge=1, description="processes that classify batches (report, plan, rebalance)")
    source_field: str = Field("source", description="row field naming the sample's source")
    tolerance: float = Field(0.01, gt=0, lt=1, description="plan: allowed deviation per domain (0.01 = 1 pp)")

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: list[str]) -> list[str]:
        return list(check_labels(v))

    @field_validator("method")
    @classmethod
    def _method(cls, v: str) -> str:
        if v not in ("learned", "rules", "embedding"):
            raise ValueError("method must be 'learned', 'rules' or 'embedding'")
        return v
