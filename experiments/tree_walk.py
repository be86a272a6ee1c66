"""DDTree's tau on held-out sequences without running the decoder: at every anchor of the target's own
greedy continuations the drafter's best-first tree of ``--budget`` nodes is built and walked against
the tokens a greedy decoder accepts, and rounds anchor right after each miss, as decoding does
(:func:`flashdraft.train.diagnostics.calibrate_tree`, which training runs at the end on the grid
``TREE_TEMPERATURES``). ``--temperatures``: the softmax temperatures of the marginals the tree is built
from (DDTree decodes with 1); per T the walk tau, the drafts accepted at every anchor and the tree's own
estimate of them, then the temperature where the two meet; the DFlash chain's walk tau is printed first
as a check against the training run's held-out table.

    python experiments/tree_walk.py assets/gemma-3-270m-dflash --data runs/g5f/generated \
        --features runs/g5f/features --walk 64 --budget 32 --temperatures 0.5,0.7,1,1.4
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from flashdraft.train.config import TrainConfig
from flashdraft.train.data import collate
from flashdraft.train.diagnostics import calibrate_tree, walk_batch
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
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig.load(Path(a.drafter) / "train_config.yaml", data=a.data, features=a.features,
                               init_from=a.drafter, out_dir=tmp, holdout_walk=0, eval_n=0, threads=a.threads,
                               tensorboard=False)
        trainer = Trainer(cfg)
    v = trainer.variants[0]
    obj, ids = v.objective, v.drafter.target_layer_ids
    examples = trainer.heldout[: a.walk]
    features_of = lambda b, rows: trainer._features_of(b, rows, ids, obj.wants_final(cfg))  # noqa: E731
    chain: list[int] = []  # the DFlash chain's rounds, the check against the training run's table
    for s in range(0, len(examples), 2):
        rows = [[e] for e in examples[s : s + 2]]
        batch = collate(rows, [cfg.seed * 1_000_003 + e.index for e in examples[s : s + 2]])
        with torch.no_grad():
            chain += walk_batch(obj, batch, *features_of(batch, rows))["drafter"]
    print(f"{len(examples)} held-out sequences of {', '.join(a.data)}; drafter {a.drafter}")
    print("| method | walk tau | rounds | accepted at every anchor | the tree's estimate of it |")
    print("|---|---|---|---|---|")
    print(f"| dflash chain | {sum(chain) / len(chain):.3f} | {len(chain)} | - | - |")
    for b in a.budget or [32]:
        cal = calibrate_tree(obj, examples, features_of, b, seed=cfg.seed, temperatures=temps)
        for t, p in cal["per_temperature"].items():
            print(f"| ddtree@{b}, T={t:g} | {p['walk_tau']:.3f} | {p['rounds']} | {p['accepted']:.3f} | {p['expected']:.3f} |")
        print(f"| ddtree@{b}: calibrated tree_temperature {cal['tree_temperature']} | | | | |")


if __name__ == "__main__":
    main()
