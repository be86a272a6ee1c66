"""Save a randomly initialised DFlash drafter for a target (for `flashdraft bench` smoke runs and CI).

    python experiments/save_random_drafter.py runs/drafter-random --layers 1 --block-size 16
"""

from __future__ import annotations

import argparse

import torch

from flashdraft.models.dflash import DFlashDrafter
from flashdraft.models.target import load_target

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--target", default="gemma-3-270m")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    t = load_target(a.target)
    print(DFlashDrafter.for_target(t, num_layers=a.layers, block_size=a.block_size, seed=a.seed).save_pretrained(a.out))
