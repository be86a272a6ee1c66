"""Per-class precision/recall of the `flashdraft mix` classifier on a labeled set, and its samples/s.

    python experiments/mix_classifier_eval.py                       # the held-out eval set shipped in the package
    python experiments/mix_classifier_eval.py --set src/flashdraft/mix/data/dev_set.jsonl --errors 5

The set is JSONL with a ``label`` and an ``origin`` per row and the sample in any layout that
``flashdraft mix`` reads. Throughput is measured on the set's samples repeated to ``--n-speed``
rows, single process, after normalisation (classification only).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from pathlib import Path

from flashdraft.mix.methods import make_classifier
from flashdraft.mix.records import to_sample

DEFAULT_SET = Path(__file__).resolve().parents[1] / "src/flashdraft/mix/data/eval_set.jsonl"
BARS = {"coding": 0.9, "math": 0.9, "tool_calling": 0.9, "translation": 0.9, "general": 0.8, "agent": 0.8}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", type=Path, default=DEFAULT_SET)
    ap.add_argument("--method", default="learned", help="learned (default), rules or embedding")
    ap.add_argument("--model", default=None, help="head file (learned: default the shipped one; embedding: required)")
    ap.add_argument("--n-speed", type=int, default=20000)
    ap.add_argument("--errors", type=int, default=0, help="print up to N misclassified rows per class")
    a = ap.parse_args()
    rows = [json.loads(l) for l in a.set.read_text().splitlines() if l.strip()]
    samples = [to_sample(r, "eval", i) for i, r in enumerate(rows)]
    gold = [r["label"] for r in rows]
    clf = make_classifier(a.method, model_path=a.model)
    labels = clf.classify_batch(samples)
    pred = [l.domain for l in labels]
    classes = sorted(set(gold) | set(pred))
    tp = Counter(g for g, p in zip(gold, pred) if g == p)
    n_gold, n_pred = Counter(gold), Counter(pred)
    print(f"set: {a.set} ({len(rows)} rows), method: {a.method}")
    print(f"{'class':<14}{'n':>5}{'precision':>11}{'recall':>9}{'bar':>6}  met")
    for c in classes:
        prec = tp[c] / n_pred[c] if n_pred[c] else float("nan")
        rec = tp[c] / n_gold[c] if n_gold[c] else float("nan")
        bar = BARS.get(c)
        met = "" if bar is None or not n_gold[c] else ("yes" if prec >= bar and rec >= bar else "NO")
        print(f"{c:<14}{n_gold[c]:>5}{prec:>11.3f}{rec:>9.3f}{bar if bar else '':>6}  {met}")
    print(f"accuracy: {sum(tp.values()) / len(rows):.3f}")
    confusion = Counter((g, p) for g, p in zip(gold, pred) if g != p)
    if confusion:
        print("confusions (gold -> predicted: n):", ", ".join(f"{g}->{p}: {n}" for (g, p), n in confusion.most_common()))
    if a.errors:
        shown = Counter()
        for r, s, l in zip(rows, samples, labels):
            if r["label"] != l.domain and shown[r["label"]] < a.errors:
                shown[r["label"]] += 1
                print(f"--- gold {r['label']} pred {l.domain} ({l.rule}) {r['origin']}\n  signals {l.signals}\n"
                      f"  prompt {s.prompt[:200]!r}\n  response {s.response[:200]!r}")
    reps = (samples * (a.n_speed // len(samples) + 1))[: a.n_speed]
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(reps), 1024):
        clf.classify_batch(reps[i : i + 1024])
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    print(f"throughput: {len(reps) / dt:,.0f} samples/s wall, {len(reps) / dc:,.0f} samples/s per CPU-second "
          f"({len(reps)} samples, {dt:.2f} s wall, {dc:.2f} s CPU, 1 process, mean sample "
          f"{sum(len(s.prompt) + len(s.response) for s in samples) / len(samples):,.0f} chars; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
