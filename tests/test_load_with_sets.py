"""``--config FILE`` + ``--set key=value`` + flags over a typed section (:meth:`flashdraft.config.Section.load`)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flashdraft.bench.config import BenchDecodeConfig
from flashdraft.cli import app
from flashdraft.config import ConfigError, sets_to_dict
from flashdraft.decode import DECODERS
from flashdraft.decode.config import DecodeConfig


def test_sets_to_dict_reads_yaml_values_and_dotted_keys():
    assert sets_to_dict(["a=1", "b=0.5", "c=[4, 8]", "d=text", "e.f=true"]) == {
        "a": 1, "b": 0.5, "c": [4, 8], "d": "text", "e": {"f": True}}
    with pytest.raises(ConfigError, match="not key=value"):
        sets_to_dict(["oops"])


def test_file_then_sets_then_flags(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text("method: dflash\ntemperature: 0.5\nmax_new_tokens: 10\n")
    cfg = DecodeConfig.load(f, sets=["temperature=0.7", "seed=3"], seed=4)
    assert (cfg.method, cfg.temperature, cfg.max_new_tokens, cfg.seed) == ("dflash", 0.7, 10, 4)
    with pytest.raises(ConfigError, match="temprature"):
        DecodeConfig.load(None, sets=["temprature=1"])
    b = BenchDecodeConfig.load(None, sets=["budgets=[4, 8]", "ngram=false"])
    assert b.budgets == [4, 8] and b.ngram is False


def test_decode_method_comes_from_the_registry():
    assert set(DECODERS) >= {"ar", "dflash", "ddtree", "ngram"}
    with pytest.raises(ConfigError, match="unknown decoding method 'beam'.*ddtree"):
        DecodeConfig.load(None, sets=["method=beam"])


def test_decode_verb_and_run_alias_refuse_the_same_bad_set():
    for verb in ("decode", "run"):
        r = CliRunner().invoke(app, [verb, "hello", "--set", "method=beam"])
        assert r.exit_code == 2 and "unknown decoding method" in r.output, r.output
