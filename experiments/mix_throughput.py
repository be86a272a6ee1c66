"""Samples/s per core of the `flashdraft mix` classifiers (median of 3 runs), one process, one thread.

    python experiments/mix_throughput.py                  # the default (learned) classifier and the rules
    python experiments/mix_throughput.py --n 20000 --set src/flashdraft/mix/data/pool.jsonl

Samples are the rows of a labelled set (default: the held-out eval set plus the pool), normalised once,
repeated to ``--n``; only classification is timed. Per core = samples / CPU-seconds of this process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from flashdraft.mix.methods import make_classifier
from flashdraft.mix.records import to_sample

DATA = Path(__file__).resolve().parents[1] / "src/flashdraft/mix/data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", type=Path, nargs="*", default=[DATA / "eval_set.jsonl", DATA / "pool.jsonl"])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--methods", default="learned,rules")
    a = ap.parse_args()
    rows = [json.loads(l) for p in a.set for l in p.read_text().split("\n") if l.strip()]
    samples = [to_sample(r, "bench", i) for i, r in enumerate(rows)]
    reps = (samples * (a.n // len(samples) + 1))[: a.n]
    chars = sum(len(s.prompt) + len(s.response) for s in samples) / len(samples)
    print(f"{len(samples)} distinct samples (mean {chars:,.0f} chars), {len(reps)} per run, "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for method in a.methods.split(","):
        clf = make_classifier(method)
        clf.classify_batch(reps[:256])  # warm up (lazy imports, regex caches)
        per_cpu, wall = [], []
        for _ in range(3):
            t0, c0 = time.perf_counter(), time.process_time()
            for i in range(0, len(reps), 1024):
                clf.classify_batch(reps[i:i + 1024])
            wall.append(len(reps) / (time.perf_counter() - t0))
            per_cpu.append(len(reps) / (time.process_time() - c0))
        print(f"{method:<8} median of 3: {statistics.median(per_cpu):,.0f} samples/s per CPU-second "
              f"({statistics.median(wall):,.0f} samples/s wall); runs: " + ", ".join(f"{x:,.0f}" for x in per_cpu))


if __name__ == "__main__":
    main()
