"""Small hand-written samples of each domain for the mix unit tests (not the evaluation set)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SAMPLES = {
    "coding": {"prompt": "Write a function that reverses a list.",
               "response": "```python\ndef rev(xs):\n    return xs[::-1]\n```\nThis returns a new list."},
    "math": {"prompt": "Solve for x: 2x + 3 = 11.",
             "response": "Subtract 3: $2x = 8$, so $x = \\frac{8}{2} = 4$. The answer is \\boxed{4}."},
    "general": {"prompt": "Give me three tips for a good night's sleep.",
                "response": "Keep a regular schedule, avoid screens before bed, and keep your bedroom cool and dark."},
    "tool_calling": {"messages": [{"role": "user", "content": "What's the weather in Paris?"}],
                     "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
                         "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
                     "response": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
    "agent": {"prompt": "Question: Who wrote Dune?",
              "response": "Thought: I should search.\nAction: Search[Dune novel]\nObservation: Dune is a 1965 novel "
                          "by Frank Herbert.\nThought: I know the answer.\nFinal Answer: Frank Herbert"},
    "translation": {"prompt": "Translate to French: The weather is nice today.",
                    "response": "Il fait beau aujourd'hui."},
}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def mixed_jsonl(tmp_path: Path) -> Path:
    """A JSONL file with 10 rows per domain (6 domains), two sources."""
    rows = []
    for d, s in SAMPLES.items():
        for i in range(10):
            rows.append({**s, "id": f"{d}-{i}", "source": "a" if i % 2 else "b"})
    return write_jsonl(tmp_path / "mixed.jsonl", rows)
