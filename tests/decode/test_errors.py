"""Bad decoding input gets a clear error naming the argument and the fix."""

import pytest
from typer.testing import CliRunner

from flashdraft.cli import app
from flashdraft.decode import DecodeError, build_decoder
from flashdraft.models.dflash import DFlashDrafter
from tests.tiny import MASK_ID, tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")


@pytest.fixture(scope="module")
def drafter(target):
    return DFlashDrafter.for_target(target, mask_token_id=MASK_ID, block_size=4)


def test_unknown_method(target):
    with pytest.raises(DecodeError, match="unknown decoding method 'medusa'; choose one of: ar, ddtree, ddtree_ngram, dflash, eagle3, eagle3_tree, ngram, ngram_tree"):
        build_decoder("medusa", target)


def test_budget_below_one(target, drafter):
    with pytest.raises(DecodeError, match="--budget must be >= 1"):
        build_decoder("ddtree", target, drafter, budget=0)


def test_speculative_method_without_drafter(target):
    with pytest.raises(DecodeError, match="needs a drafter; pass --drafter"):
        build_decoder("ddtree", target)


@pytest.mark.parametrize("prompt,new,temp,match", [
    ([], 8, 0.0, "empty prompt"),
    ([1, 2], 0, 0.0, "max_new_tokens must be >= 1"),
    ([1, 2], 8, -1.0, "temperature must be >= 0"),
    ([1, 999], 8, 0.0, "token ids must lie in 0..95"),
    ([1, 2], 5000, 0.0, "exceeds the target's 1024 positions"),
])
def test_bad_requests(target, drafter, prompt, new, temp, match):
    with pytest.raises(DecodeError, match=match):
        build_decoder("dflash", target, drafter).generate(prompt, new, temperature=temp)


def test_cli_reports_errors_without_traceback(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["run", "hello", "--method", "dflash", "--target", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "error:" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["run", "hello", "--budget", "0"])
    assert r.exit_code == 2 and "budget" in r.output
    bad = tmp_path / "run.yaml"
    bad.write_text("methd: ar\n")
    r = runner.invoke(app, ["run", "hello", "--config", str(bad)])
    assert r.exit_code == 2 and "methd" in r.output
    r = runner.invoke(app, ["run", "hello", "--method", "ddtree", "--sizing", "cheap"])
    assert r.exit_code == 2 and "sizing" in r.output and "Traceback" not in r.output
