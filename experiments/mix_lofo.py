"""Leave-one-family-out and leave-one-repository-out accuracy of the `flashdraft mix` classifiers, and the shipped head.

    python experiments/mix_lofo.py                      # LOFO and LORO tables of the learned head, and the rules
    python experiments/mix_lofo.py --save src/flashdraft/mix/data/head.npz   # also train on everything and ship

Rows: ``data/pool.jsonl`` (families named per row) + ``data/dev_set.jsonl`` (families from ``origin``:
HumanEval, GSM8K, BFCL, SWE-agent, Django catalogs, package READMEs, docstrings, agent prompt files).
For every family F the head is retrained (vocabulary, feature scale and weights) on the rows of every
other family and scores F: no row of F, and no token chosen because of F, is seen in training.
Leave-one-repository-out (LORO) holds out every row whose ``origin`` names the same repository (a GitHub
repository, or a PyPI package) at once: the families of one repository share a style (MT-Bench's math, coding
and general rows), so a family left out alone still has its siblings in training. LORO is the figure for a
source never seen; its 95% intervals resample whole repositories (cluster bootstrap, 1,000 draws).
The rules are fixed code: they were written and tuned on the dev-set families only; their format
signals (tool-call syntaxes, numbered ReAct, equation lines) were written from public format documents,
so for those formats the rules-part of the features is not blind to the family (said in the output).
Training weights give every family the same total weight within its domain and every domain the same
total. The held-out ``eval_set.jsonl`` is scored by the head trained on all families (it never trains on it).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from flashdraft.mix.learned import LearnedClassifier
from flashdraft.mix import features as F
from flashdraft.mix.records import to_sample

DATA = Path(__file__).resolve().parents[1] / "src/flashdraft/mix/data"
DOMAINS = ("coding", "math", "general", "tool_calling", "agent", "translation")


def family_of(row: dict) -> str:
    """The family of a row: its ``family`` field, or one derived from the dev set's ``origin``."""
    if row.get("family"):
        return row["family"]
    o = row["origin"]
    for pat, fam in ((r"grade-school-math", "gsm8k"), (r"human-eval", "humaneval"), (r"gorilla", "bfcl"),
                     (r"SWE-agent", "swe-agent"), (r"django", "django-po"), (r"(mpmath|scipy|sympy):", "docstrings"),
                     (r"langchain/.*agents|smolagents/.*prompts", "agent-prompt-files"),
                     (r"pypi-(installed|wheel):", "readmes")):
        if re.search(pat, o):
            return fam
    return "misc"


def repository_of(row: dict) -> str:
    """The repository a row comes from: ``owner/name`` of a ``github:`` origin, the package of a ``pypi*:`` one."""
    m = re.match(r"(github|pypi[\w-]*):([^@:/#\s]+(?:/[^@:/#\s]+)?)", row["origin"])
    if not m:
        return row["origin"].split(":")[0]
    name = m.group(2)
    return name if m.group(1) == "github" else "pypi:" + name.split("/")[0].lower().replace("-", "_")


def load(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().split("\n") if l.strip()]


def weights_for(fams: list[str], gold: list[str]) -> np.ndarray:
    """Each (domain, family) pair weighs 1 / (families in its domain), spread over its rows."""
    n_pair = Counter(zip(gold, fams))
    fams_per_dom = Counter(d for d, _ in n_pair)
    return np.array([1.0 / (n_pair[(g, f)] * fams_per_dom[g]) for g, f in zip(gold, fams)])


def predict(clf: LearnedClassifier, rows: list[dict], structural: bool = True) -> list[str]:
    """Domains for rows by the classifier's own decision order (keyword labels aside)."""
    clf.structural = structural
    return [lab.domain for lab in clf.classify_batch([to_sample(r, "x", i) for i, r in enumerate(rows)])]


def held_out(items, gold, rows, groups, fams, structural: bool, l2: float = 3e-3) -> list[str]:
    """Each group's rows labelled by a head trained on every other group's rows (vocabulary and scale too)."""
    pred = [""] * len(rows)
    for g in sorted(set(groups)):
        tr = [i for i, x in enumerate(groups) if x != g]
        te = [i for i, x in enumerate(groups) if x == g]
        clf = LearnedClassifier.fit([items[i] for i in tr], [gold[i] for i in tr],
                                    weights_for([fams[i] for i in tr], [gold[i] for i in tr]), l2=l2)
        for i, p in zip(te, predict(clf, [rows[i] for i in te], structural)):
            pred[i] = p
    return pred


def cluster_interval(gold, pred, groups, draws: int = 1000, seed: int = 0) -> dict:
    """95% intervals of accuracy and per-domain recall, resampling whole groups (rows of a group are not
    independent draws)."""
    by = defaultdict(list)
    for i, g in enumerate(groups):
        by[g].append(i)
    keys = sorted(by)
    # per group: (rows, correct) overall and per domain
    stats = np.array([[len(by[k]), sum(gold[i] == pred[i] for i in by[k])]
                      + [x for d in DOMAINS for x in (sum(gold[i] == d for i in by[k]),
                                                      sum(gold[i] == d == pred[i] for i in by[k]))] for k in keys], float)
    rng = np.random.default_rng(seed)
    tot = stats[rng.integers(0, len(keys), (draws, len(keys)))].sum(1)  # (draws, 2 + 2 * domains)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = tot[:, 1] / tot[:, 0]
        rec = tot[:, 3::2] / tot[:, 2::2]
    q = lambda v: [float(np.nanquantile(v, 0.025)), float(np.nanquantile(v, 0.975))]
    return {"accuracy": q(acc), "recall": {d: q(rec[:, j]) for j, d in enumerate(DOMAINS)}}


def table(gold, pred, fams) -> tuple[list, dict]:
    per = defaultdict(lambda: [0, 0])
    for g, p, f in zip(gold, pred, fams):
        per[(f, g)][0] += 1
        per[(f, g)][1] += g == p
    rec = {d: sum(g == p for g, p in zip(gold, pred) if g == d) / max(1, gold.count(d)) for d in DOMAINS}
    return sorted(per.items(), key=lambda kv: (kv[0][1], kv[1][1] / kv[1][0])), rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--save", type=Path, default=None, help="train on every family and write the head here")
    ap.add_argument("--no-structural", action="store_true", help="measure without the per-turn precedence rule")
    ap.add_argument("--l2", type=float, default=3e-3, help="the head's L2 penalty")
    ap.add_argument("--json", type=Path, default=None, help="write the per-family figures as JSON")
    a = ap.parse_args()
    rows = load(DATA / "pool.jsonl") + load(DATA / "dev_set.jsonl")
    rows = [r for r in rows if r["label"] in DOMAINS]
    fams = [family_of(r) for r in rows]
    gold = [r["label"] for r in rows]
    probe = LearnedClassifier(DOMAINS, [], np.zeros((0, 6), np.float32), np.zeros(6, np.float32), np.zeros(0))
    t0 = time.perf_counter()
    analysed = probe.features([to_sample(r, "pool", i) for i, r in enumerate(rows)])
    print(f"{len(rows)} rows, {len(set(fams))} families; features in {time.perf_counter() - t0:.1f} s")
    items = [(F.numeric_features(sig), toks) for _, sig, toks in analysed]
    repos = [repository_of(r) for r in rows]
    t0 = time.perf_counter()
    pred = held_out(items, gold, rows, fams, fams, not a.no_structural, a.l2)
    print(f"LOFO: {len(set(fams))} folds in {time.perf_counter() - t0:.0f} s")
    t0 = time.perf_counter()
    pred_repo = held_out(items, gold, rows, repos, fams, not a.no_structural, a.l2)
    print(f"LORO: {len(set(repos))} folds in {time.perf_counter() - t0:.0f} s")
    rules = [lab.domain for lab, _, _ in analysed]
    runs = (("learned head (LOFO)", pred, fams), ("learned head (LORO)", pred_repo, repos), ("rules (fixed)", rules, repos))
    for name, pr, groups in runs:
        per, rec = table(gold, pr, groups)
        acc = sum(g == p for g, p in zip(gold, pr)) / len(gold)
        ci = cluster_interval(gold, pr, repos)
        print(f"\n== {name}: accuracy {acc:.3f} (95% {ci['accuracy'][0]:.3f}-{ci['accuracy'][1]:.3f}, repositories "
              f"resampled) over {len(gold)} rows; recall " + ", ".join(
                  f"{d} {r:.3f} ({ci['recall'][d][0]:.2f}-{ci['recall'][d][1]:.2f})" for d, r in rec.items()))
        prec = {d: sum(g == p for g, p in zip(gold, pr) if p == d) / max(1, pr.count(d)) for d in DOMAINS}
        print("   precision " + ", ".join(f"{d} {v:.3f}" for d, v in prec.items()))
        group_word = "family" if groups is fams else "repository"
        figures = {"accuracy": acc, "recall": rec, "precision": prec, "interval": ci, "rows": len(gold),
                   "families": len(set(fams)), "repositories": len(set(repos)),
                   "confusion": {g: {p: sum(1 for gg, pp in zip(gold, pr) if gg == g and pp == p)
                                     for p in DOMAINS + ("other",)} for g in DOMAINS},
                   f"per_{group_word}": [{group_word: f, "domain": d, "n": n, "accuracy": c / n}
                                         for (f, d), (n, c) in per]}
        if name.startswith("rules"):
            rules_fig = figures
            continue
        if "LOFO" in name:
            lofo = figures
        else:
            loro = figures
        print(f"| {group_word} | domain | n | accuracy | most frequent error |\n|---|---|---:|---:|---|")
        for (f, d), (n, c) in per:
            if c == n and "LORO" in name:
                continue  # the LORO table lists only the repositories with an error
            errs = Counter(p for g, p, ff in zip(gold, pr, groups) if ff == f and g == d and p != g)
            top = ", ".join(f"{k} {v}" for k, v in errs.most_common(2))
            print(f"| {f} | {d} | {n} | {c / n:.2f} | {top} |")
    if a.json:
        a.json.write_text(json.dumps({"lofo": lofo, "loro": loro}, indent=1))
    clf = LearnedClassifier.fit(items, gold, weights_for(fams, gold), l2=a.l2)
    ev = load(DATA / "eval_set.jsonl")
    ev_pred = predict(clf, ev, not a.no_structural)
    ev_acc = sum(r["label"] == p for r, p in zip(ev, ev_pred)) / len(ev)
    print(f"\nheld-out eval_set.jsonl ({len(ev)} rows), head trained on all pool+dev families: accuracy {ev_acc:.3f}; "
          "recall " + ", ".join(f"{d} {sum(r['label'] == p == d for r, p in zip(ev, ev_pred)) / max(1, sum(r['label'] == d for r in ev)):.3f}"
                                for d in DOMAINS))
    from flashdraft.mix.classify import RuleClassifier

    rules = RuleClassifier()
    rules_fig["heldout_eval_set_accuracy"] = sum(
        r["label"] == rules.classify(s.prompt, s.response).domain
        for r, s in ((r, to_sample(r, "eval", i)) for i, r in enumerate(ev))) / len(ev)
    print(f"rules on the held-out eval_set.jsonl: accuracy {rules_fig['heldout_eval_set_accuracy']:.3f}")
    if a.save:
        clf.meta = {"trained_on": "pool.jsonl + dev_set.jsonl", "rows": len(gold), "families": len(set(fams)),
                    "lofo": lofo, "loro": loro, "heldout_eval_set_accuracy": ev_acc, "rules": rules_fig}
        clf.save(a.save)
        print(f"saved the head ({len(clf.names)} features) to {a.save}")


if __name__ == "__main__":
    main()
