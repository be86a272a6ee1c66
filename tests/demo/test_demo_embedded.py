"""The real `flashdraft demo` on the embedded Gemma-3-270M at its smallest settings, through the CLI:
every stage runs, writes its marker and the report; a second call skips them all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flashdraft.cli import app

pytestmark = pytest.mark.embedded
ROOT = Path(__file__).resolve().parents[2]
TINY = ["--prompts", "2", "--new-tokens", "12", "--backend", "hf", "--minutes", "0.5", "--bench-prompts", "1",
        "--bench-tokens", "8", "--budgets", "4", "--set", "train_steps=2", "--set", "train_set=[\"save_every=1\", "
        "\"holdout=0\", \"batch_size=2\", \"max_len=64\", \"bf16=false\"]",
        "--drafter", str(ROOT / "assets/gemma-3-270m-dflash"), "--set", f"recipe={ROOT / 'recipes/gemma3_270m_dflash.yaml'}"]


def test_demo_smallest_settings(tmp_path):
    out = tmp_path / "demo"
    r = CliRunner().invoke(app, ["demo", "--out", str(out), *TINY])
    assert r.exit_code == 0, r.output
    for stage in ("prompts", "generate", "mix", "train", "bench", "export", "report"):
        assert (out / "stages" / f"{stage}.json").is_file(), stage
    summary = json.loads((out / "report" / "summary.json").read_text())
    assert summary["headline"]["lossless"]
    assert set(summary["headline"]["drafters"]) == {"shipped", "trained"}
    assert (out / "export" / "vllm" / "config.json").is_file() and "vllm serve" in (out / "export" / "serve.sh").read_text()
    assert "report.html" in r.output
    again = CliRunner().invoke(app, ["demo", "--out", str(out), *TINY])
    assert again.exit_code == 0 and again.output.count("skipped") == 7, again.output


def test_demo_on_the_chat_target_uses_its_template(tmp_path):
    """`demo --target smollm2-135m-instruct`: no shipped drafter for it, so a fresh one is trained and benched alone;
    generate and bench render prompts through its ChatML template, and the report says so."""
    out = tmp_path / "demo"
    tiny = [a for a in TINY if a != str(ROOT / "assets/gemma-3-270m-dflash") and a != "--drafter"]
    r = CliRunner().invoke(app, ["demo", "--out", str(out), "--target", "smollm2-135m-instruct", *tiny])
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "report" / "summary.json").read_text())
    assert summary["headline"]["lossless"] and set(summary["headline"]["drafters"]) == {"trained"}
    assert "Prompting (generate and bench): the target's chat template" in (out / "report" / "report.md").read_text()
    import pyarrow.parquet as pq

    rows = pq.read_table(sorted((out / "generated").glob("*.parquet"))[0]).to_pylist()
    assert all(r["token_ids"][:1] == [1] and 4093 in r["token_ids"][:40] for r in rows)  # <|im_start|> ... user
    cfg = json.loads((out / "train" / "drafter" / "config.json").read_text())
    assert cfg["prompting"]["chat_template"] is True and cfg["dflash_config"]["mask_token_id"] == 5
