"""Wall-clock timing shared by the stages: the median of a few runs after untimed warm-ups."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_ms(fn: Callable[[], object], repeats: int, warmup: int) -> float:
    """Median wall time of ``fn()`` in ms over ``repeats`` runs after ``warmup`` untimed runs."""
    times = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3
