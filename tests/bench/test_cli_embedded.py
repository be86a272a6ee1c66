"""The three verbs through the CLI on the embedded Gemma-3-270M with a random drafter (CI-sized runs),
and the clear error for a drafter that does not fit the target."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from flashdraft.bench.cli import app
from flashdraft.models.dflash import DFlashDrafter
from tests.tiny import tiny_target

pytestmark = pytest.mark.embedded


@pytest.fixture(scope="module")
def gemma_drafter(tmp_path_factory, embedded_target):
    path = tmp_path_factory.mktemp("drafter") / "random-b4"
    return DFlashDrafter.for_target(embedded_target, num_layers=1, block_size=4).save_pretrained(path)


def test_decode_then_model_on_gemma(gemma_drafter, tmp_path):
    runner = CliRunner()
    dec = tmp_path / "decode"
    res = runner.invoke(app, ["decode", "--drafter", str(gemma_drafter), "--prompts", "humaneval", "--limit", "1",
                              "--budgets", "2", "--max-new-tokens", "4", "--repeats", "1", "-o", str(dec)])
    assert res.exit_code == 0, res.output
    assert "no chat template" in res.output
    saved = json.loads((dec / "results.json").read_text())
    rows = saved["sets"]["humaneval@T=0"]
    assert set(rows) == {"ar", "random-b4/dflash", "random-b4/ddtree@2", "random-b4/chain@2",
                         "ngram", "ngram_tree@2", "random-b4/ddtree_ngram@2"}
    assert all(s["identical_to_ar"] == 1 for s in rows.values())
    assert (dec / "table.md").is_file() and len(list(dec.glob("*.png"))) == 2

    mod = tmp_path / "model"
    res = runner.invoke(app, ["model", "--profile", "--drafter", str(gemma_drafter), "--decode-results",
                              str(dec / "results.json"), "--profile-sizes", "1,3,4", "--profile-repeats", "1",
                              "--concurrency", "1,2", "-o", str(mod)])
    assert res.exit_code == 0, res.output
    assert "predicted vs measured" in res.output and "within 15%" in res.output
    pred = json.loads((mod / "model_prediction.json").read_text())
    assert {v["variant"] for v in pred["validation"]} == {"dflash", "ddtree@2", "chain@2", "ddtree_ngram@2"}
    assert (mod / "model.png").read_bytes()[:4] == b"\x89PNG"


def test_model_preset_prints_inputs(tmp_path):
    res = CliRunner().invoke(app, ["model", "--preset", "kimi-k2-pcie8", "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    for needle in ("tp: 8", "interconnect: pcie", "layers: 61", "hidden: 7168", "stops paying"):
        assert needle in res.output, needle


def test_drafter_for_another_target_is_refused(tmp_path):
    bad = DFlashDrafter.for_target(tiny_target("gemma3"), num_layers=1, block_size=4, mask_token_id=0)
    bad.save_pretrained(tmp_path / "bad")
    res = CliRunner().invoke(app, ["decode", "--drafter", str(tmp_path / "bad"), "--limit", "1",
                                   "-o", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert "does not match" in res.output and "hidden_size" in res.output
