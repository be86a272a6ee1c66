"""`flashdraft mix rebalance`: write a training set at an exact target mix, reproducibly.

Two streaming passes over the data: the first classifies every row and keeps one byte per row
(its domain); the selection is then drawn with a seeded numpy generator (down-sampling without
replacement, or up-sampling as whole repeats plus a random remainder, at most ``max_repeat``
copies of a row); the second pass writes the chosen rows, in input order, to a temp file that
replaces the output only when complete.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flashdraft.io import atomic_path, check_not_input, check_output_file
from flashdraft.mix.classify import classify_stream
from flashdraft.mix.domains import MixError
from flashdraft.mix.records import iter_rows, iter_samples


@dataclass
class RebalanceResult:
    """What was written: rows per domain, and the achieved shares."""

    path: Path
    written: dict[str, int]
    available: dict[str, int]
    total: int

    def shares(self) -> dict[str, float]:
        return {d: n / self.total if self.total else 0.0 for d, n in self.written.items()}


def allocate(target: dict[str, float], total: int) -> dict[str, int]:
    """Integer counts per domain that sum to ``total`` and follow ``target`` (largest remainder)."""
    raw = {d: target[d] * total for d in target}
    counts = {d: math.floor(v) for d, v in raw.items()}
    rest = total - sum(counts.values())
    for d in sorted(raw, key=lambda d: (-(raw[d] - counts[d]), d))[:rest]:
        counts[d] += 1
    return counts


def max_total(target: dict[str, float], available: dict[str, int], max_repeat: int) -> int:
    """The largest total reachable at ``target`` with at most ``max_repeat`` copies of each row."""
    limits = [available.get(d, 0) * max_repeat / s for d, s in target.items() if s > 0]
    n = int(math.floor(min(limits))) if limits else 0
    while n > 0 and any(c > available.get(d, 0) * max_repeat for d, c in allocate(target, n).items()):
        n -= 1
    return n


def choose_copies(domains: np.ndarray, labels: tuple[str, ...], want: dict[str, int], max_repeat: int,
                  seed: int) -> np.ndarray:
    """Copies to write of each row (uint16 array) so that domain ``d`` gets exactly ``want[d]`` rows."""
    rng = np.random.default_rng(seed)
    copies = np.zeros(len(domains), dtype=np.uint16)
    for k, d in enumerate(labels):
        idx = np.flatnonzero(domains == k)
        n = want.get(d, 0)
        if n == 0:
            continue
        if len(idx) == 0 or n > len(idx) * max_repeat:
            raise MixError(f"domain {d!r} needs {n:,} samples but the data has {len(idx):,} "
                           f"(at most {len(idx) * max_repeat:,} with --max-repeat {max_repeat}); lower --total, "
                           f"raise --max-repeat, lower the {d} share, or add {d} data")
        full, rem = divmod(n, len(idx))
        copies[idx] = full
        if rem:
            copies[rng.choice(idx, size=rem, replace=False)] += 1
    return copies


def classify_rows(path: str | Path, classifier, batch_size: int = 4096, workers: int = 1) -> np.ndarray:
    """First pass: the domain index (into ``classifier.labels``) of every row, as an int8 array."""
    index = {d: i for i, d in enumerate(classifier.labels)}
    parts = []
    for batch, labels in classify_stream(iter_samples(path, batch_size), classifier, workers):
        parts.append(np.fromiter((index[lab.domain] for lab in labels), dtype=np.int8, count=len(batch)))
    if not parts:
        raise MixError(f"{path} holds no samples; point at a non-empty JSONL/Parquet file or dataset")
    return np.concatenate(parts)


def rebalance(path: str | Path, out: str | Path, classifier, target: dict[str, float], total: int | None = None,
              max_repeat: int = 1, seed: int = 0, domain_field: str = "domain",
              batch_size: int = 4096, workers: int = 1) -> RebalanceResult:
    """Write ``out`` (.jsonl or .parquet) holding rows of ``path`` at exactly the ``target`` mix."""
    out = Path(out)
    if not out.name.endswith((".jsonl", ".parquet")):
        raise MixError(f"output {out} must end in .jsonl or .parquet")
    check_not_input(out, [path])
    check_output_file(out)
    if max_repeat < 1:
        raise MixError(f"--max-repeat must be >= 1 (1 = no up-sampling), got {max_repeat}")
    labels = tuple(classifier.labels)
    missing = [d for d in target if d not in labels]
    if missing:
        raise MixError(f"target domains {missing} are not in the classifier's label set {list(labels)}")
    domains = classify_rows(path, classifier, batch_size, workers)
    available = {d: int(np.count_nonzero(domains == k)) for k, d in enumerate(labels)}
    limit = max_total(target, available, max_repeat)
    if total is None:
        if limit == 0:
            short = [d for d, s in target.items() if s > 0 and available.get(d, 0) == 0]
            raise MixError(f"the data has no samples of {short}, which the target asks for; add such data or "
                           "set those shares to 0")
        total = limit
    if total <= 0:
        raise MixError(f"--total must be positive, got {total}")
    want = allocate({d: target.get(d, 0.0) for d in labels}, total)
    copies = choose_copies(domains, labels, want, max_repeat, seed)
    written = _write(path, out, copies, domains, labels, domain_field, batch_size)
    return RebalanceResult(out, written, available, int(copies.sum()))


def _write(path, out: Path, copies: np.ndarray, domains: np.ndarray, labels: tuple[str, ...], domain_field: str,
           batch_size: int) -> dict[str, int]:
    """Second pass: write each row ``copies[i]`` times to a temp file that replaces ``out`` when complete."""
    written = dict.fromkeys(labels, 0)
    i = 0
    with atomic_path(out) as tmp:
        if out.name.endswith(".jsonl"):
            with open(tmp, "w", encoding="utf-8") as fh:
                for rows in iter_rows(path, batch_size):
                    for row in rows:
                        k = int(copies[i])
                        if k:
                            d = labels[domains[i]]
                            line = json.dumps({**row, domain_field: d}, ensure_ascii=False, default=str) + "\n"
                            fh.write(line * k)
                            written[d] += k
                        i += 1
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            writer = None
            schema = None
            try:
                for rows in iter_rows(path, batch_size):
                    chosen = []
                    for row in rows:
                        k = int(copies[i])
                        if k:
                            d = labels[domains[i]]
                            chosen.extend([{**row, domain_field: d}] * k)
                            written[d] += k
                        i += 1
                    if not chosen:
                        continue
                    table = pa.Table.from_pylist(chosen, schema=schema)
                    if writer is None:
                        schema = table.schema
                        writer = pq.ParquetWriter(tmp, schema)
                    writer.write_table(table)
            finally:
                if writer is not None:
                    writer.close()
            if writer is None:
                pq.write_table(pa.table({domain_field: pa.array([], pa.string())}), tmp)
        if i != len(copies):
            raise MixError(f"{path} changed between the two passes ({len(copies)} rows, then {i}); rerun on a "
                           "stable copy of the data")
    return written
