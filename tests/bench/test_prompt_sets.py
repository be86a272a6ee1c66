"""The named evaluation sets: per domain, a dev and a test part that never overlap, every row with its origin and
licence, and the shipped file exactly what its builder makes from the project's own material."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from flashdraft.bench.decode_bench import BenchError, load_prompt_set
from flashdraft.bench.prompt_sets import DATA, domain_of, named_sets

ROOT = Path(__file__).resolve().parents[2]


def test_every_domain_has_a_dev_and_a_test_part_that_do_not_overlap():
    sets = named_sets()
    for domain in ("code", "math", "chat", "multilingual"):
        dev, test = sets[f"{domain}-dev"], sets[f"{domain}-test"]
        assert len(test) >= 16 and dev
        assert not {r["origin"] for r in dev} & {r["origin"] for r in test}
        assert not {r["prompt"] for r in dev} & {r["prompt"] for r in test}
        assert all(r["origin"] and r["licence"] and r["prompt"].strip() for r in dev + test)
        assert domain_of(f"{domain}-test") == domain
    # the recipe's eval (HumanEval/0-7) chose the shipped drafters: it is dev, never test
    assert [r["id"] for r in sets["code-dev"]] == [f"HumanEval/{i}" for i in range(8)]
    assert [r["id"] for r in sets["code-test"]] == [f"HumanEval/{i}" for i in range(148, 164)]
    assert domain_of("humaneval") is None


def test_bench_reads_named_sets_and_names_them_when_missing():
    name, prompts = load_prompt_set("math-test", limit=3)
    assert name == "math-test" and len(prompts) == 3 and prompts[0].startswith("Question: ")
    with pytest.raises(BenchError, match="code-test"):
        load_prompt_set("cooking-test")


def test_the_shipped_file_is_what_the_builder_makes(tmp_path):
    spec = importlib.util.spec_from_file_location("build_prompt_sets", ROOT / "experiments" / "build_prompt_sets.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    assert builder.main(tmp_path / "sets.jsonl").read_bytes() == DATA.read_bytes()
