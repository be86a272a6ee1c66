"""A finished drafter's held-out figures, as its training run prints them, and the decode walk checked
against real decoding on the target's own greedy HumanEval continuations.

1. The training run's held-out table (the same held-out sequences: the drafter's ``train_config.yaml``
   with ``init_from`` = the drafter): per-slot accuracy, context ablation, baselines, ``tau proxy``
   (mean over random anchors) and ``walk tau`` (rounds anchored as a greedy decoder anchors them).
2. The first ``--humaneval`` HumanEval prompts (never trained on): the target's greedy continuation,
   the same table on it, and real greedy decoding with the drafter's method: its tau should equal the
   walk's (the walk reads the same sequence; rounds past the data's end are cut short).

    python experiments/heldout_walk.py assets/gemma-3-270m-dflash --data runs/corpus/corpus.jsonl \
        --features runs/corpus/features
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from flashdraft.bench.decode_bench import load_prompt_set
from flashdraft.models.forward import target_pass
from flashdraft.train.config import TrainConfig
from flashdraft.train.data import Example
from flashdraft.train.diagnostics import format_report, heldout_report
from flashdraft.train.evaluate import evaluate_tau
from flashdraft.train.loop import Trainer


def humaneval_examples(target, n: int, new_tokens: int) -> list[Example]:
    """Prompt (BOS + HumanEval prompt, unsupervised) + the target's greedy continuation (supervised)."""
    out = []
    for i, text in enumerate(load_prompt_set("humaneval", n)[1]):  # the first n, as `bench decode` reads them
        ids = target.encode(text)
        cont = target.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     max_new_tokens=new_tokens, do_sample=False)[0, len(ids):].tolist()
        out.append(Example(token_ids=ids + cont, loss_mask=[0] * len(ids) + [1] * len(cont), index=i))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("drafter", help="an exported drafter folder with its train_config.yaml")
    ap.add_argument("--data", action="append", required=True, help="the training data (the held-out split is drawn from it)")
    ap.add_argument("--features", default=None, help="its feature cache (optional: else one target pass a batch)")
    ap.add_argument("--walk", type=int, default=32, help="held-out sequences walked")
    ap.add_argument("--humaneval", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig.load(Path(a.drafter) / "train_config.yaml", data=a.data, features=a.features,
                               init_from=a.drafter, out_dir=tmp, holdout_walk=a.walk, eval_n=0, threads=a.threads,
                               tensorboard=False)
        trainer = Trainer(cfg)
        trainer.diagnose()  # prints the held-out table
    target, v = trainer.target, trainer.variants[0]
    if a.humaneval:
        ex = humaneval_examples(target, a.humaneval, a.new_tokens)
        ids = v.drafter.target_layer_ids
        rep = heldout_report(v.objective, ex, lambda b, rows: target_pass(target, b, ids, v.objective.wants_final(cfg)),
                             trainer.ngram, batch_size=4, walk=len(ex))
        print(f"target's greedy HumanEval continuations ({a.humaneval} prompts):")
        print(format_report(rep, trainer.step))
        prompts = [e.token_ids[: e.loss_mask.index(1)] for e in ex]
        r = evaluate_tau(target, v.drafter, prompts, a.new_tokens, v.objective.eval_method)
        print(f"real greedy decoding ({v.objective.eval_method}, {a.new_tokens} tokens): tau {r['tau']:.3f} over "
              f"{r['rounds']} rounds; walk tau {rep['drafter']['walk_tau']:.3f} over {rep['walk_rounds']} rounds")


if __name__ == "__main__":
    main()
