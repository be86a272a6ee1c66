"""DDTree's tau on held-out sequences without running the decoder: at every anchor of the target's own
greedy continuations the drafter's best-first tree of ``--budget`` nodes is built and walked against
the tokens a greedy decoder accepts, and rounds anchor right after each miss, as decoding does
(:func:`flashdraft.train.diagnostics.walk_tree_batch`). ``--temperatures``: the softmax temperature of
the marginals the tree is built from (DDTree decodes with 1); the DFlash chain's walk tau is printed
next to them as a check against the training run's held-out table.

    python experiments/tree_walk.py assets/gemma-3-270m-dflash-b8 --data runs/g5f/generated \
        --features runs/g5f/features --walk 64 --budget 32 --temperatures 0.5,0.7,1,1.4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from flashdraft.train.config import TrainConfig
from flashdraft.train.data import collate
from flashdraft.train.diagnostics import walk_batch, walk_tree_batch
from flashdraft.train.loop import Trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("drafter", help="an exported drafter folder with its train_config.yaml")
    ap.add_argument("--data", action="append", required=True, help="the training data (the held-out split is drawn from it)")
    ap.add_argument("--features", default=None, help="its feature cache (optional: else one target pass a batch)")
    ap.add_argument("--walk", type=int, default=64, help="held-out sequences walked")
    ap.add_argument("--budget", type=int, action="append", help="tree nodes (repeatable; default 32)")
    ap.add_argument("--temperatures", default="1", help="comma-separated softmax temperatures of the tree's marginals")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    temps = tuple(float(t) for t in a.temperatures.split(","))
    budgets = a.budget or [32]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig.load(Path(a.drafter) / "train_config.yaml", data=a.data, features=a.features,
                               init_from=a.drafter, out_dir=tmp, holdout_walk=0, eval_n=0, threads=a.threads,
                               tensorboard=False)
        trainer = Trainer(cfg)
    v = trainer.variants[0]
    obj, ids = v.objective, v.drafter.target_layer_ids
    taus: dict[str, list[int]] = defaultdict(list)
    accepted: dict[str, list[int]] = defaultdict(list)  # per anchor: drafts the tree's walk accepts
    expected: dict[str, list[float]] = defaultdict(list)  # per anchor: the tree's estimate of it
    examples = trainer.heldout[: a.walk]
    for s in range(0, len(examples), 2):
        rows = [[e] for e in examples[s : s + 2]]
        batch = collate(rows, [cfg.seed * 1_000_003 + e.index for e in examples[s : s + 2]])
        feats, final_h = trainer._features_of(batch, rows, ids, obj.wants_final(cfg))
        with torch.no_grad():
            taus["dflash chain"] += walk_batch(obj, batch, feats, final_h)["drafter"]
            for b in budgets:
                for t, x in walk_tree_batch(obj, batch, feats, final_h, b, temps).items():
                    taus[f"ddtree@{b}, T={t:g}"] += x["taus"]
                    accepted[f"ddtree@{b}, T={t:g}"] += x["accepted"]
                    expected[f"ddtree@{b}, T={t:g}"] += x["expected"]
    print(f"{len(examples)} held-out sequences of {', '.join(a.data)}; drafter {a.drafter}")
    print("| method | walk tau | rounds | median tau | accepted at every anchor | the tree's estimate of it |")
    print("|---|---|---|---|---|---|")
    for name, t in taus.items():
        acc, est = accepted.get(name), expected.get(name)
        cal = f"{statistics.mean(acc):.3f} | {statistics.mean(est):.3f}" if acc else "- | -"
        print(f"| {name} | {sum(t) / len(t):.3f} | {len(t)} | {statistics.median(t):g} | {cal} |")


if __name__ == "__main__":
    main()
