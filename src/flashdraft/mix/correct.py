"""Domain shares corrected for the classifier's known confusion, with bootstrap intervals.

A share counted from a classifier's labels is not exact: with confusion matrix ``C[i, j] = P(label j |
true domain i)`` (measured leave-one-family-out on the labelled pool), the expected label shares are
``q = C^T p`` for true shares ``p``. :func:`corrected_shares` solves that for ``p`` (non-negative least
squares with the shares summing to 1) and draws intervals by resampling both the confusion counts
(a Dirichlet per true domain) and the observed label counts (a Dirichlet over labels).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

SUM_WEIGHT = 10.0  # weight of the "shares sum to 1" row in the least-squares system


def _solve(c: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Shares p >= 0 (summing to 1) that best explain label shares q = C^T p."""
    from scipy.optimize import nnls

    a = np.vstack([c.T, SUM_WEIGHT * np.ones((1, c.shape[0]))])
    y = np.concatenate([q, [SUM_WEIGHT]])
    p, _ = nnls(a, y)
    return p / p.sum() if p.sum() > 0 else np.full(len(p), 1 / len(p))


def corrected_shares(counts: Mapping[str, int], confusion: Mapping[str, Mapping[str, int]], draws: int = 400,
                     seed: int = 0, level: float = 0.95) -> dict[str, dict[str, float]]:
    """Per true domain of ``confusion``: the raw label share, the corrected share and its interval.

    ``counts``: labels given to the data (any label; labels the confusion never predicts count as noise);
    ``confusion[true][label]``: counts of the labelled pool. Returns {domain: {raw, corrected, low, high}}.
    """
    true = list(confusion)
    cols = sorted({p for row in confusion.values() for p in row} | set(counts))
    cmat = np.array([[confusion[t].get(p, 0) for p in cols] for t in true], dtype=float)  # (true, labels)
    obs = np.array([counts.get(p, 0) for p in cols], dtype=float)
    total = obs.sum()
    if total == 0:
        return {}
    point = _solve(cmat / cmat.sum(1, keepdims=True).clip(min=1), obs / total)
    rng = np.random.default_rng(seed)
    boot = np.empty((draws, len(true)))
    for b in range(draws):
        cb = np.stack([rng.dirichlet(row + 0.5) for row in cmat])
        qb = rng.dirichlet(obs + 0.5)
        boot[b] = _solve(cb, qb)
    lo, hi = np.quantile(boot, [(1 - level) / 2, 1 - (1 - level) / 2], axis=0)
    return {t: {"raw": counts.get(t, 0) / total, "corrected": float(point[i]), "low": float(lo[i]),
                "high": float(hi[i])} for i, t in enumerate(true)}


def quality_of(classifier) -> dict | None:
    """What is known of ``classifier``'s accuracy, from the shipped head's metadata (for the rules, their figures on
    the same pool): held-out accuracy, LOFO and LORO figures, and the confusion used for correction (LORO's where
    the head has it, else LOFO's)."""
    method = getattr(classifier, "method", "")
    meta = getattr(classifier, "meta", None)
    if meta is None and method == "rules":
        from flashdraft.mix.learned import DEFAULT_HEAD, LearnedClassifier

        try:
            meta = LearnedClassifier.load(DEFAULT_HEAD).meta
        except Exception:  # no shipped head: no figures to show
            return None
        meta = meta.get("rules") and {"lofo": meta["rules"], "heldout_eval_set_accuracy":
                                      meta["rules"].get("heldout_eval_set_accuracy")}
    if not meta or "lofo" not in meta:
        return None
    lofo, loro = meta["lofo"], meta.get("loro")
    # the correction uses the confusion measured on whole unseen repositories where it is known: a user's data
    # comes from sources the pool never saw
    return {"method": method, "heldout_accuracy": meta.get("heldout_eval_set_accuracy"),
            "lofo_accuracy": lofo["accuracy"], "lofo_recall": lofo["recall"], "families": lofo.get("families"),
            "loro_accuracy": loro and loro["accuracy"], "loro_recall": loro and loro["recall"],
            "loro_interval": loro and loro.get("interval"), "repositories": loro and loro.get("repositories"),
            "rows": lofo.get("rows"), "confusion": (loro or lofo)["confusion"],
            "note": "rules are fixed code: their pool figure is plain accuracy" if method == "rules" else
            "each family scored by a head trained without it"}
