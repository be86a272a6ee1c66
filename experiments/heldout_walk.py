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

3. With ``--prompts SET`` (repeatable; a named set such as ``code-test``, ``--limit`` prompts each) and several
   drafters: per set, the target's greedy continuations (made once, kept in ``--cache``) and each drafter's walk
   tau with MASK in the draft slots (what vLLM serves) beside prompt lookup's on the same sequences; ``--decode N``
   also decodes the first N prompts of each set and prints the real tau next to the walk's.

    python experiments/heldout_walk.py runs/spec/spec_drafter runs/spec/flashdraft/drafter --data runs/mixed/data \
        --humaneval 0 --prompts code-test --prompts math-test --limit 16 --new-tokens 128 --cache runs/spec/test_cont.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from flashdraft.bench.decode_bench import load_prompts
from flashdraft.io import atomic_write_text
from flashdraft.models.chat import ChatSettings
from flashdraft.models.forward import target_pass
from flashdraft.train.config import TrainConfig
from flashdraft.train.data import Example
from flashdraft.train.diagnostics import format_report, heldout_report
from flashdraft.train.evaluate import evaluate_tau
from flashdraft.train.loop import Trainer


def humaneval_examples(target, n: int, new_tokens: int, spec: str = "humaneval", batch: int = 1,
                       chat: ChatSettings = ChatSettings()) -> list[Example]:
    """Prompt (the set's prompt as ``bench decode`` renders it: the target's chat template when it has one,
    unsupervised) + the target's greedy continuation (supervised), ``batch`` prompts a generate call (left-padded;
    each answer cut after its first end-of-turn token)."""
    texts = load_prompts(spec, n)[1]  # the first n, as `bench decode` reads them
    out = []
    pad = target.tokenizer.pad_token_id or 0
    stops = set(target.eos_token_ids)
    for s in range(0, len(texts), batch):
        ids = [chat.encode(target, t) for t in texts[s : s + batch]]
        width = max(map(len, ids))
        x = torch.tensor([[pad] * (width - len(i)) + i for i in ids])  # [b, width]
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
        gen = target.model.generate(x, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                    pad_token_id=pad)[:, width:].tolist()
        for i, cont in zip(ids, gen):
            cut = next((j + 1 for j, t in enumerate(cont) if t in stops), len(cont))
            cont = cont[:cut]
            out.append(Example(token_ids=i + cont, loss_mask=[0] * len(i) + [1] * len(cont), index=len(out)))
    return out


def cached_examples(target, spec: str, n: int, new_tokens: int, cache: Path | None,
                    chat: ChatSettings = ChatSettings()) -> list[Example]:
    """:func:`humaneval_examples` of a named set, read from / added to the JSON file ``cache`` when given."""
    key = f"{spec}:{n}:{new_tokens}" + (":chat" if chat.uses_template(target.tokenizer) else "")
    saved = json.loads(cache.read_text()) if cache is not None and cache.is_file() else {}
    if key not in saved:
        made = humaneval_examples(target, n, new_tokens, spec, batch=n, chat=chat)
        saved[key] = [{"token_ids": e.token_ids, "loss_mask": e.loss_mask} for e in made]
        if cache is not None:
            atomic_write_text(cache, json.dumps(saved))
    return [Example(token_ids=r["token_ids"], loss_mask=r["loss_mask"], index=i) for i, r in enumerate(saved[key])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("drafter", nargs="+", help="drafter folders, each with its train_config.yaml (or a training run's "
                    "drafter/, whose run folder holds config.yaml)")
    ap.add_argument("--data", action="append", required=True, help="the training data (the held-out split is drawn from it)")
    ap.add_argument("--features", default=None, help="its feature cache (optional: else one target pass a batch)")
    ap.add_argument("--walk", type=int, default=32, help="held-out sequences walked")
    ap.add_argument("--humaneval", type=int, default=8)
    ap.add_argument("--prompts", action="append", default=[], help="a named prompt set to walk (repeatable)")
    ap.add_argument("--limit", type=int, default=16, help="prompts of each --prompts set")
    ap.add_argument("--decode", type=int, default=0, help="also decode this many prompts of each --prompts set")
    ap.add_argument("--cache", default=None, help="JSON file keeping the target's continuations of the sets")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hints", choices=("none", "lookup"), default=None,
                    help="draft slots: MASK (none, what vLLM serves) or prompt lookup's chain (default: as the drafter's "
                    "config says)")
    ap.add_argument("--heldout", action=argparse.BooleanOptionalAction, default=True,
                    help="print the held-out table of --data first (--no-heldout: the prompt sets only)")
    ap.add_argument("--chat-template", choices=("auto", "never"), default="auto",
                    help="auto: the prompt sets rendered with the target's chat template when it has one")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target, rows = None, []
    for drafter in a.drafter:
        with tempfile.TemporaryDirectory() as tmp:
            conf = Path(drafter) / "train_config.yaml"  # a shipped drafter's; a run's drafter/ has it one folder up
            conf = conf if conf.is_file() else Path(drafter).parent / "config.yaml"
            cfg = TrainConfig.load(conf, data=a.data,
                                   init_from=drafter, out_dir=tmp, holdout_walk=a.walk, eval_n=0, threads=a.threads,
                                   tensorboard=False, **({"block_hints": a.hints} if a.hints else {}))
            cfg = cfg.model_copy(update={"features": a.features})  # not the run's own cache (made for its own data)
            trainer = Trainer(cfg, target=target)
            print(f"== {drafter}" + (f" (hints {a.hints})" if a.hints else ""))
            if a.heldout:
                trainer.diagnose()  # prints the held-out table
        target, v = trainer.target, trainer.variants[0]
        ids = v.drafter.target_layer_ids
        if a.humaneval:
            ex = humaneval_examples(target, a.humaneval, a.new_tokens, chat=ChatSettings(mode=a.chat_template))
            rep = heldout_report(v.objective, ex, lambda b, rows: target_pass(target, b, ids, v.objective.wants_final(cfg)),
                                 trainer.ngram, batch_size=4, walk=len(ex))
            print(f"target's greedy HumanEval continuations ({a.humaneval} prompts):")
            print(format_report(rep, trainer.step))
            prompts = [e.token_ids[: e.loss_mask.index(1)] for e in ex]
            r = evaluate_tau(target, v.drafter, prompts, a.new_tokens, v.objective.eval_method)
            print(f"real greedy decoding ({v.objective.eval_method}, {a.new_tokens} tokens): tau {r['tau']:.3f} over "
                  f"{r['rounds']} rounds; walk tau {rep['drafter']['walk_tau']:.3f} over {rep['walk_rounds']} rounds")
        for spec in a.prompts:
            ex = cached_examples(target, spec, a.limit, a.new_tokens, Path(a.cache) if a.cache else None,
                                 ChatSettings(mode=a.chat_template))
            rep = heldout_report(v.objective, ex, lambda b, rows: target_pass(target, b, ids, v.objective.wants_final(cfg)),
                                 trainer.ngram, batch_size=4, walk=len(ex))
            row = {"drafter": drafter, "set": spec, "hints": a.hints, "prompts": len(ex), "walk_rounds": rep["walk_rounds"],
                   **{f"{k}_walk_tau": rep[k]["walk_tau"] for k in ("drafter", "prompt_lookup") if k in rep},
                   "acc_slot_1_2_4_8": [rep["drafter"]["acc_per_slot"][i] for i in (0, 1, 3, 7)]}
            if "drafter_unary" in rep:  # DFlash2: the unary argmax before reranking, and the selector's own figures
                row["unary_acc_slot_1_2_4_8"] = [rep["drafter_unary"]["acc_per_slot"][i] for i in (0, 1, 3, 7)]
                row.update(candidate_recall=rep["candidate_recall"], selector_acc=rep["selector_acc"])
            if a.decode:
                prompts = [e.token_ids[: e.loss_mask.index(1)] for e in ex[: a.decode]]
                row["decode_tau"] = evaluate_tau(target, v.drafter, prompts, a.new_tokens, v.objective.eval_method)["tau"]
            print(json.dumps(row))
            rows.append(row)
    if rows:
        print("| drafter | set | walk tau (served) | prompt lookup walk tau | slot 1 / 2 / 4 / 8 acc |")
        print("|---|---|---|---|---|")
        for r in rows:
            acc = " / ".join(f"{x:.2f}" for x in r["acc_slot_1_2_4_8"])
            print(f"| {r['drafter']} | {r['set']} | {r['drafter_walk_tau']:.2f} | {r.get('prompt_lookup_walk_tau', float('nan')):.2f} | {acc} |")


if __name__ == "__main__":
    main()
