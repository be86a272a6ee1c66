"""Named evaluation prompt sets, shipped with the package: ``<set>-<split>`` for ``bench decode --prompts``.

Sets by domain: ``code`` (HumanEval), ``math`` (GSM8K), ``chat`` (MT-Bench and Vicuna-bench questions) and
``multilingual`` (MGSM in 10 languages), each split into ``dev`` (to choose checkpoints, temperatures and recipes)
and ``test`` (only to report; 16 prompts each). A row's ``prompt`` is its rendering for a base model (plain
continuation); :func:`chat_messages` gives the user turn a chat model gets through its template. Every row records its origin (repository or package, commit,
file, item) and licence; ``experiments/build_prompt_sets.py`` builds the file from material the project ships.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "prompt_sets.jsonl"
SPLITS = ("dev", "test")


@cache
def named_sets() -> dict[str, list[dict]]:
    """``"<set>-<split>"`` -> its rows (``prompt`` rendered for a base model, ``question``, ``origin``, ``licence``)."""
    out: dict[str, list[dict]] = {}
    for line in DATA.read_text().splitlines():
        r = json.loads(line)
        out.setdefault(f"{r['set']}-{r['split']}", []).append(r)
    return out


CODE_REQUEST = "Complete this Python function.\n\n```python\n{question}```"


def chat_messages(row: dict) -> tuple[dict, ...]:
    """A set row as a chat model's user sends it: the bare question (for code, the function to complete in a
    fenced block with the request), where ``prompt`` is its rendering for a base model."""
    q = row["question"]
    return ({"role": "user", "content": CODE_REQUEST.format(question=q) if row["set"] == "code" else q},)


def domain_of(name: str) -> str | None:
    """The domain of a named set (``math-test`` -> ``math``), None for anything else."""
    return name.rsplit("-", 1)[0] if name in named_sets() else None
