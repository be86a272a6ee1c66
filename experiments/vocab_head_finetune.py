"""Fine-tune only the LM head of a DFlash drafter (every other weight frozen) on a generate output, for the
draft-vocabulary size trade of `docs/results.md`: the vocabularies of `experiments/vocab_trade.py` differ only in
their head, and rows added from the target's head were never trained with the drafter's hidden states (served
as they are, they lower tau). The same steps, data, seed and learning rate for every size, the original 8,192-id
head included, so the sizes differ in nothing but the vocabulary.

    python experiments/vocab_head_finetune.py runs/vocab_trade/v32768 --data runs/vocab_trade/ft_data \
        --out runs/vocab_trade/ft32768 --steps 150
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from flashdraft.io import atomic_write_text
from flashdraft.models.drafter import load_drafter
from flashdraft.models.target import load_target
from flashdraft.train.data import DataStream, load_examples
from flashdraft.train.objective import DFlashObjective


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("drafter")
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-anchors", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    target = load_target("gemma-3-270m")
    d = load_drafter(a.drafter, target).float()
    d.train()
    for name, p in d.named_parameters():
        p.requires_grad_(name == "lm_head.weight")
    examples, stats = load_examples([a.data], target, max_len=256, block_size=d.block_size)
    stream = DataStream(examples, a.batch_size, a.seed)
    objective = DFlashObjective(d, max_anchors=a.max_anchors, loss="ce", hint_prob=0.0)  # MASK blocks: as served
    opt = torch.optim.AdamW([d.lm_head.weight], lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    log = []
    t0 = time.perf_counter()
    for step in range(1, a.steps + 1):
        batch = stream.next_batch()
        blocks = objective.blocks(batch)
        out = objective(batch, blocks, blocks.norm)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        hit = float(out.correct[..., 1].sum()) / max(float((blocks.weights[..., 1] > 0).sum()), 1.0)
        log.append({"step": step, "loss": float(out.loss.detach()), "slot1_acc": hit, "s": time.perf_counter() - t0})
        if step % 10 == 0 or step == a.steps:
            print(json.dumps(log[-1]), flush=True)
    d.eval()
    out = d.save_pretrained(a.out)
    atomic_write_text(out / "finetune_log.json", json.dumps(
        {"drafter": a.drafter, "data": a.data, "sequences": stats.kept, "steps": a.steps, "batch_size": a.batch_size,
         "max_anchors": a.max_anchors, "lr": a.lr, "log": log}, indent=1))


if __name__ == "__main__":
    main()
