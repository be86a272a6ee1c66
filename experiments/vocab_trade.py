"""Draft vocabularies of several sizes for one trained DFlash drafter, for the size trade of
`docs/results.md` ("Draft vocabulary size").

Each size keeps the drafter's own draft ids and LM-head rows and adds the most frequent tokens of a
corpus (per domain, ``--reserve`` of the size split evenly over the corpus's domains), their rows
started from the target's LM head (the rows the drafter's head was trained from), so every size drafts
what the drafter drafts today wherever the smaller vocabulary could, and can also propose the added ids.
No size is retrained: the figures measure what the vocabulary alone changes.

The corpus is `flashdraft mix`'s labelled pool and dev set (human and model text of every domain),
less every row that holds a named-set test question. Then, e.g.:

    python experiments/vocab_trade.py --out runs/vocab_trade
    flashdraft bench decode $(for s in 8192 16384 32768 262144; do echo --drafter runs/vocab_trade/v$s; done) \
        --prompts code-dev ... --hints none --rows '*/dflash' ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from flashdraft.bench.prompt_sets import named_sets
from flashdraft.io import atomic_write_text
from flashdraft.models.drafter import load_drafter
from flashdraft.models.draft_vocab import reserved_token_ids
from flashdraft.models.target import load_target
from flashdraft.train.data import corpus_counts

MIX_DATA = Path(__file__).resolve().parents[1] / "src" / "flashdraft" / "mix" / "data"


def squash(text: str) -> str:
    return " ".join(text.split()).lower()


def test_free_corpus(out: Path, splits: tuple[str, ...] = ("test",)) -> Path:
    """The mix pool and dev set without any row that contains (or is contained in) a question of the named sets'
    ``splits`` parts (``("test", "dev")``: nothing a figure is chosen or reported on)."""
    tests = [squash(r["question"]) for name, rows in named_sets().items() if name.rsplit("-", 1)[-1] in splits
             for r in rows]
    kept = dropped = 0
    lines = []
    for f in ("pool.jsonl", "dev_set.jsonl"):
        for line in (MIX_DATA / f).read_text().splitlines():
            r = json.loads(line)
            text = squash(str(r.get("prompt", "")) + " " + str(r.get("response", "")))
            if any(q[:200] in text for q in tests):
                dropped += 1
                continue
            lines.append(line)
            kept += 1
    path = out / "corpus.jsonl"
    atomic_write_text(path, "\n".join(lines) + "\n")
    print(f"corpus: {kept} rows kept, {dropped} holding a {'/'.join(splits)} question dropped -> {path}")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default="assets/gemma-3-270m-dflash")
    ap.add_argument("--target", default="gemma-3-270m")
    ap.add_argument("--sizes", default="8192,16384,32768,262144")
    ap.add_argument("--reserve", type=float, default=0.5)
    ap.add_argument("--out", default="runs/vocab_trade")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    target = load_target(a.target)
    base = load_drafter(a.drafter, target)
    keep = base.draft_token_ids()  # [Vd] target ids, in draft order
    counts = corpus_counts([test_free_corpus(out)], target, domain_field="label")
    print("corpus tokens per domain: " + ", ".join(f"{d} {int(c.sum()):,}" for d, c in sorted(counts.items())))
    for size in (int(s) for s in a.sizes.split(",")):
        ids = reserved_token_ids(counts, size, a.reserve, always=torch.cat([keep, torch.tensor(target.eos_token_ids)]))
        cfg = base.cfg.model_copy(deep=True)
        cfg.draft_vocab_size = size
        d = type(base)(cfg).to(dtype=target.dtype).bind(target)
        state = {k: v for k, v in base.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
        missing, unexpected = d.load_state_dict(state, strict=False)
        assert set(missing) == {"lm_head.weight", "d2t", "t2d"} and not unexpected, (missing, unexpected)
        d.set_draft_vocab(ids)  # every row from the target's LM head ...
        with torch.no_grad():  # ... then the drafter's own rows where it has them
            d.lm_head.weight[d.t2d_index()[keep]] = base.lm_head.weight
        d.save_pretrained(out / f"v{size}")
        print(f"v{size}: {size} draft ids ({size - keep.numel()} added) -> {out / f'v{size}'}")


if __name__ == "__main__":
    main()
