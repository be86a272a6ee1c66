"""--config FILE and --set key=value reach each verb's typed config (YAML first, then --set, then flags)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer
from typer.testing import CliRunner

from flashdraft.config import ConfigError, Section, parse_sets
from flashdraft.generate.config import GenerateConfig


def _invoke(command, args):
    app = typer.Typer()
    app.command()(command)
    return CliRunner().invoke(app, args)


def _yaml(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_parse_sets_types_and_unknown_keys():
    assert parse_sets(["max_tokens=7", "stop=[a, b]", "thinking=null"], GenerateConfig) == {
        "max_tokens": 7, "stop": ["a", "b"], "thinking": None}
    with pytest.raises(ConfigError, match=r"no such generate config field; known: sources, limit"):
        parse_sets(["nonsense=1"], GenerateConfig)
    with pytest.raises(ConfigError, match="key=value"):
        parse_sets(["max_tokens"], GenerateConfig)
    with pytest.raises(ConfigError, match="max_tokens"):  # pydantic checks the type and bounds
        GenerateConfig.load(None, sets=["max_tokens=0"])


def test_order_yaml_then_set_then_flags(tmp_path):
    class Demo(Section):
        a: int = 0
        b: int = 0
        c: int = 0

    cfg = Demo.load(_yaml(tmp_path, "a: 1\nb: 1\nc: 1\n"), sets=["b=2", "c=2"], c=3)
    assert (cfg.a, cfg.b, cfg.c) == (1, 2, 3)


def test_generate(tmp_path, monkeypatch):
    from flashdraft.generate import runner
    from flashdraft.generate.cli import generate

    seen = []
    monkeypatch.setattr(runner, "run", seen.append)
    r = _invoke(generate, ["--config", _yaml(tmp_path, "sources: [stdlib-code]\nbackend: hf\nmax_tokens: 9\n"),
                           "--set", "max_tokens=7"])
    assert r.exit_code == 0, r.output
    assert seen[0].sources == ["stdlib-code"] and seen[0].backend == "hf" and seen[0].max_tokens == 7
    bad = _invoke(generate, ["stdlib-code", "--set", "nonsense=1"])
    assert bad.exit_code == 2 and "no such generate config field" in bad.output


@pytest.mark.parametrize("verb", ["report", "plan", "rebalance"])
def test_mix(tmp_path, monkeypatch, verb):
    from flashdraft.mix import cli

    seen = []

    def classifier(cfg):
        seen.append(cfg)
        raise cli.MixError("stop")

    monkeypatch.setattr(cli, "_classifier", classifier)
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "p", "response": "r"}\n')
    args = {"report": ["report", str(data)],
            "plan": ["plan", str(data), "--target", "coding=1", "--total", "5", "--candidate", f"a={data}"],
            "rebalance": ["rebalance", str(data), "--target", "coding=1", "--out", str(tmp_path / "o.jsonl")]}[verb]
    r = CliRunner().invoke(cli.app, [*args, "--config", _yaml(tmp_path, "method: rules\nseed: 3\nexamples: 2\n"),
                                     "--set", "seed=11"])
    assert r.exit_code == 2 and "stop" in r.output
    assert (seen[0].method, seen[0].seed, seen[0].examples) == ("rules", 11, 2)


def test_export_import_serve_cmd(tmp_path, monkeypatch):
    from flashdraft.export import cli, formats, importers, serve
    from flashdraft.models import target as target_mod

    seen = {}

    def fake_export(src, fmt, out, tgt, ref, modeling_file, dtype, overwrite=False):
        seen["export"] = (src, fmt, out, tgt, ref, dtype)
        raise formats.ExportError("stop")

    monkeypatch.setattr(target_mod, "load_target", lambda spec, **kw: f"loaded {spec}")
    monkeypatch.setattr(target_mod, "resolve_target_path", lambda spec: f"/models/{spec}")
    monkeypatch.setattr(formats, "export_drafter", fake_export)
    r = _invoke(cli.export, ["--config", _yaml(tmp_path, "drafter: d\nto: vllm\nout: o\ntarget: t\n"),
                             "--set", "dtype=bfloat16"])
    assert r.exit_code == 2 and "stop" in r.output
    assert seen["export"] == (Path("d"), "vllm", Path("o"), "loaded t", "t", "bfloat16")  # files name the target as given

    def fake_import(src, out, fmt, tgt, mask, overwrite=False):
        seen["import"] = (str(src), str(out), fmt, mask)
        return out, fmt, []

    def fake_serve(drafter, target, family, port):
        seen["serve"] = (target, port)
        return {}

    monkeypatch.setattr(importers, "import_drafter", fake_import)
    r = _invoke(cli.import_, ["--config", _yaml(tmp_path, "source: s\nout: o\nfrom: zlab\n"),
                              "--set", "mask_token_id=5"])
    assert r.exit_code == 0, r.output
    assert seen["import"] == ("s", "o", "zlab", 5)

    folder = tmp_path / "exported"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    monkeypatch.setattr(serve, "serve_commands", fake_serve)
    r = _invoke(cli.serve_cmd, ["--config", _yaml(tmp_path, f"drafter: {json.dumps(str(folder))}\ntarget: org/m\n"),
                                "--set", "port=9001"])
    assert r.exit_code == 0, r.output
    assert seen["serve"] == ("org/m", 9001)


def test_features(tmp_path, monkeypatch):
    from flashdraft.models import target as target_mod
    from flashdraft.train import data as data_mod
    from flashdraft.train.features_cli import features

    seen = []
    fake = SimpleNamespace(num_layers=4, name="t", default_layer_ids=lambda n: [1])
    monkeypatch.setattr(target_mod, "load_target", lambda spec, **kw: fake)

    def fake_examples(paths, tgt, max_len, block_size, append_eos):
        seen.append((paths, max_len, block_size))
        raise data_mod.TrainError("stop")

    monkeypatch.setattr(data_mod, "load_examples", fake_examples)
    r = _invoke(features, ["--out", str(tmp_path / "f"), "--device", "cpu",
                           "--config", _yaml(tmp_path, "data: [d.jsonl]\nmax_len: 64\nblock_size: 4\n"),
                           "--set", "max_len=32"])
    assert r.exit_code == 2 and "stop" in r.output
    assert seen == [(["d.jsonl"], 32, 4)]
