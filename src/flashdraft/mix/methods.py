"""The classifier methods of ``flashdraft mix`` by name: rules, learned (the default) and embedding."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from flashdraft.mix.classify import RuleClassifier
from flashdraft.mix.domains import DEFAULT_DOMAINS, MixError
from flashdraft.mix.embed import EmbeddingClassifier
from flashdraft.mix.learned import LearnedClassifier

METHODS = ("learned", "rules", "embedding")


def make_classifier(method: str = "learned", labels: Iterable[str] = DEFAULT_DOMAINS,
                    keyword_labels: Mapping[str, Sequence[str]] | None = None, model_path: str | None = None,
                    abstain_below: float = 0.0):
    """Build the classifier named by ``method``: "learned" (the default; ``model_path`` or the shipped head),
    "rules", or "embedding" with a trained ``model_path``."""
    if method == "rules":
        return RuleClassifier(labels, keyword_labels)
    if method == "learned":
        return LearnedClassifier.load(model_path, labels=labels, keyword_labels=keyword_labels,
                                      abstain_below=abstain_below)
    if method == "embedding":
        if not model_path:
            raise MixError("--method embedding needs --model PATH, a head trained with `flashdraft mix train-embed`")
        return EmbeddingClassifier.load(model_path)
    raise MixError(f"unknown classifier method {method!r}; use {', '.join(repr(m) for m in METHODS)}")
