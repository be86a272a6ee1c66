"""Regressions of the bad-input and fault sweep: every reproducer exits 2 with one line naming the thing and the
fix (or succeeds with a warning where success is right), and no file that was there before is lost or changed.

Targets are tiny HF folders (a random 2-layer Qwen3 with a small BPE tokenizer), so each command is quick.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from flashdraft.cli import app
from flashdraft.generate.output import part_files, read_records
from tests.generate.conftest import build_tiny_model, write_jsonl


def invoke(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def refused(r, *phrases: str) -> str:
    """The one ``error:`` line of a command that exited 2 without a traceback; it holds every phrase."""
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, r.output
    for p in phrases:
        assert p in errors[0], errors[0]
    return errors[0]


def snapshot(*paths: Path) -> dict[str, bytes]:
    """Every file under ``paths`` and its bytes, to check that nothing was lost or changed."""
    out = {}
    for p in paths:
        for f in [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file()):
            out[str(f)] = f.read_bytes()
    return out


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-target"))


@pytest.fixture(scope="module")
def drafter_dir(tiny_dir, tmp_path_factory) -> Path:
    from flashdraft.models.dflash import DFlashDrafter
    from flashdraft.models.target import load_target

    target = load_target(str(tiny_dir))
    drafter = DFlashDrafter.for_target(target, num_layers=1, block_size=4, mask_token_id=0, seed=1, target_layer_ids=[0])
    return drafter.save_pretrained(tmp_path_factory.mktemp("drafter") / "d")


def edited(drafter_dir: Path, tmp_path: Path, name: str, **fields) -> Path:
    """A copy of the drafter folder with ``fields`` of config.json set."""
    out = tmp_path / name
    out.mkdir()
    cfg = json.loads((drafter_dir / "config.json").read_text())
    cfg.update(fields)
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "model.safetensors").write_bytes((drafter_dir / "model.safetensors").read_bytes())
    return out


# ---- 1-7: data lost or results invented --------------------------------------------------------------------------

def test_export_and_import_never_delete_what_they_did_not_write(tiny_dir, drafter_dir, tmp_path):
    x = tmp_path / "x"
    x.mkdir()
    (x / "notes.txt").write_text("n\n")
    before = snapshot(x)
    refused(invoke("export", drafter_dir, "--to", "vllm", "-o", x, "--target", tiny_dir), "notes.txt", "--overwrite")
    assert snapshot(x) == before
    f = tmp_path / "f.txt"
    f.write_text("keep\n")
    refused(invoke("export", drafter_dir, "--to", "vllm", "-o", f, "--target", tiny_dir), "is an existing file")
    refused(invoke("import", drafter_dir, "-o", f), "is an existing file")
    assert f.read_text() == "keep\n"
    refused(invoke("import", drafter_dir, "-o", drafter_dir), "would overwrite the input")
    # --overwrite writes into the folder and keeps the other files; so does a second export into its own folder
    r = invoke("export", drafter_dir, "--to", "vllm", "-o", x, "--target", tiny_dir, "--overwrite")
    assert r.exit_code == 0, r.output
    assert (x / "notes.txt").read_text() == "n\n" and (x / "model.safetensors").is_file()
    r = invoke("export", drafter_dir, "--to", "zlab", "-o", x, "--target", tiny_dir)
    assert r.exit_code == 0, r.output
    assert (x / "notes.txt").read_text() == "n\n" and json.loads((x / "flashdraft_export.json").read_text())["format"] == "zlab"


def test_rebalance_refuses_to_overwrite_its_input(tmp_path):
    rows = [{"prompt": f"Write a Python function that sorts list number {i}.", "response": "def f(x):\n    return sorted(x)"}
            for i in range(3)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    before = snapshot(data)
    refused(invoke("mix", "rebalance", data, "--target", "coding=1.0", "--out", data, "--method", "rules"),
            "would overwrite the input")
    assert snapshot(data) == before


def test_resume_refuses_a_source_name_that_now_stands_for_another_file(tiny_dir, tmp_path):
    (tmp_path / "A").mkdir()
    (tmp_path / "B").mkdir()
    a = write_jsonl(tmp_path / "A" / "p.jsonl", [{"id": i, "prompt": f"def a{i}(x):"} for i in range(2)])
    b = write_jsonl(tmp_path / "B" / "p.jsonl", [{"id": i, "prompt": f"def b{i}(x):"} for i in range(2)])
    out = tmp_path / "out"
    common = ["--target", tiny_dir, "--backend", "hf", "--dtype", "float32", "--max-tokens", "2", "-o", out,
              "--no-progress", "--chat-template", "never"]
    r = invoke("generate", a, *common)
    assert r.exit_code == 0, r.output
    before = snapshot(out)
    refused(invoke("generate", b, *common, "--resume"), "source name 'p'", str(a.resolve()), str(b.resolve()))
    assert snapshot(out) == before
    r = invoke("generate", f"p2={b}", *common, "--resume")  # a name of its own: its rows are new records
    assert r.exit_code == 0, r.output
    assert sorted(read_records(out).column("id").to_pylist()) == ["p2:0", "p2:1", "p:0", "p:1"]


def test_a_sigkill_loses_at_most_the_batch_in_flight(tiny_dir, tmp_path):
    """Default flush settings (flush_every 512): the records of each finished batch are on disk at once."""
    src = write_jsonl(tmp_path / "p.jsonl", [{"id": i, "prompt": f"def function_{i}(x):"} for i in range(60)])
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "flashdraft.generate.cli", str(src), "--target", str(tiny_dir), "--backend", "hf",
           "--dtype", "float32", "--max-tokens", "24", "--batch-size", "2", "-o", str(out), "--no-progress",
           "--chat-template", "never"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.monotonic() + 240
    while not part_files(out) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert alive, f"the run finished before its first batch reached the disk:\n{proc.stdout.read()}"
    n = len(read_records(out))
    assert 2 <= n < 60 and (out / "manifest.json").is_file()


def test_mix_report_on_content_free_data_reports_no_shares(tmp_path):
    data = write_jsonl(tmp_path / "e.jsonl", [{"prompt": ""}, {"prompt": "   "}, {"prompt": "", "response": ""}])
    refused(invoke("mix", "report", data, "--out", tmp_path / "rep"), "no classifiable rows", "3")
    assert not (tmp_path / "rep" / "report.md").exists()


def test_a_drafter_with_non_finite_weights_is_refused_and_not_exported(tiny_dir, drafter_dir, tmp_path):
    bad = edited(drafter_dir, tmp_path, "nan")
    state = load_file(str(bad / "model.safetensors"))
    name = sorted(state)[0]
    state[name] = state[name].clone()
    state[name].view(-1)[0] = float("nan")
    save_file(state, str(bad / "model.safetensors"))
    refused(invoke("decode", "def f(x):", "--target", tiny_dir, "--method", "dflash", "--drafter", bad,
                   "--max-new-tokens", "4"), "NaN or inf", name)
    refused(invoke("export", bad, "--to", "vllm", "-o", tmp_path / "e", "--target", tiny_dir), "NaN or inf")
    assert not (tmp_path / "e").exists()


def test_printed_tau_never_exceeds_what_was_emitted(tiny_dir, drafter_dir):
    r = invoke("decode", "def f(x):", "--target", tiny_dir, "--method", "dflash", "--drafter", drafter_dir,
               "--max-new-tokens", "3")
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("method=dflash"))
    stats = dict(kv.split("=") for kv in line.split()[:4])
    rounds, tau, new = int(stats["rounds"]), float(stats["tau"]), int(stats["new_tokens"])
    assert rounds >= 1 and tau * rounds == pytest.approx(new - 1)  # the first token comes from the prefill


# ---- 8-11: tracebacks instead of a one-line error ------------------------------------------------------------------

def test_an_output_path_that_is_a_file_is_refused_by_every_verb(tiny_dir, drafter_dir, tmp_path):
    f = tmp_path / "taken"
    f.write_text("mine\n")
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Write a Python function that adds two numbers.",
                                               "response": "def add(a, b):\n    return a + b"}])
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "def f(x):"}])
    refused(invoke("mix", "report", data, "--out", f), "is not a folder")
    refused(invoke("generate", prompts, "--target", tiny_dir, "--backend", "hf", "-o", f, "--no-progress"),
            "is not a folder")
    refused(invoke("train", "--data", data, "--target", tiny_dir, "--out-dir", f, "--max-steps", "1"), "is not a folder")
    refused(invoke("features", "--data", data, "--target", tiny_dir, "--out", f), "is not a folder")
    refused(invoke("bench", "decode", "--target", tiny_dir, "--prompts", prompts, "-o", f), "is not a folder")
    refused(invoke("mix", "report", data, "--out", f / "sub"), "is not a folder", f"{f} is a file")
    assert f.read_text() == "mine\n"


def test_malformed_yaml_names_the_file_and_line(tiny_dir, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_new_tokens: 4\nmethod: [ar\n")
    for args in (["decode", "hi"], ["generate", "stdlib-code"], ["train"]):
        refused(invoke(*args, "--config", bad), f"{bad} is not valid YAML at line")
    refused(invoke("bench", "model", "--input", bad, "-o", tmp_path / "m"), "is not valid YAML at line")
    refused(invoke("decode", "hi", "--config", tmp_path), "is a folder; pass a YAML file")


@pytest.mark.parametrize("fields,phrases", [
    ({"block_size": "sixteen"}, ["config.json is not a DFlash drafter config", "block_size: Input should be a valid integer", "(found 'sixteen')"]),
    ({"hidden_size": 32.5}, ["hidden_size: Input should be a valid integer", "(found 32.5)"]),
    ({"block_size": 0}, ["block_size: Input should be greater than or equal to 2", "(found 0)"]),
    ({"target_hidden_size": 1024}, ["target_hidden_size 1024", "hidden_size 32"]),
])
def test_corrupt_or_mismatched_drafter_configs_are_named(tiny_dir, drafter_dir, tmp_path, fields, phrases):
    bad = edited(drafter_dir, tmp_path, "bad", **fields)
    refused(invoke("decode", "def f(x):", "--target", tiny_dir, "--method", "dflash", "--drafter", bad,
                   "--max-new-tokens", "2"), *phrases)


def test_a_truncated_safetensors_file_is_named(tiny_dir, drafter_dir, tmp_path):
    bad = edited(drafter_dir, tmp_path, "trunc")
    w = bad / "model.safetensors"
    w.write_bytes(w.read_bytes()[: 1000])
    before = snapshot(bad)
    refused(invoke("decode", "hi", "--target", tiny_dir, "--method", "dflash", "--drafter", bad), str(w), "truncated")
    refused(invoke("export", bad, "--to", "vllm", "-o", tmp_path / "e", "--target", tiny_dir), str(w), "truncated")
    refused(invoke("import", bad, "-o", tmp_path / "i"), str(w), "truncated")
    assert snapshot(bad) == before and not (tmp_path / "e").exists() and not (tmp_path / "i").exists()


def test_bad_targets_devices_and_prompts(tiny_dir, tmp_path):
    gguf = tmp_path / "bad.gguf"
    gguf.write_bytes(b"not a gguf at all")
    refused(invoke("decode", "hi", "--target", gguf), str(gguf), "does not load")
    folder = tmp_path / "notmodel"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    refused(invoke("decode", "hi", "--target", folder), "is not a causal LM")
    if not torch.cuda.is_available():
        refused(invoke("decode", "hi", "--target", tiny_dir, "--set", "device=cuda"), "sees no CUDA GPU", "device=cpu")
    refused(invoke("decode", "bad \udcff bytes", "--target", tiny_dir), "not valid UTF-8")


def test_bench_model_input_errors(tmp_path):
    jsonl = write_jsonl(tmp_path / "r.jsonl", [{"a": 1}, {"b": 2}])
    refused(invoke("bench", "model", "--preset", "kimi-k2-pcie8", "--decode-results", jsonl, "-o", tmp_path / "m"),
            "not the results.json")
    refused(invoke("bench", "model", "--preset", "kimi-k2-pcie8", "--tp", "0", "--gpus", "-1", "-o", tmp_path / "m"),
            "tp")


def test_resume_with_another_drafter_shape_is_refused(tmp_path):
    """A 1-layer run resumed with num_layers 2 is refused by name, before any weight or optimizer state loads;
    resumed with its own shape (or the setting left out) it goes on."""
    from flashdraft.train.loop import Trainer
    from flashdraft.train.objective import TrainError
    from tests.tiny import tiny_target
    from tests.train.test_loop import make_cfg, write_data

    data, target = write_data(tmp_path / "d.jsonl"), tiny_target("qwen3")
    Trainer(make_cfg(tmp_path, data, max_steps=4, warmup_ratio=0.0), target=target).run(stop_after=2)
    ckpts = snapshot(tmp_path / "run" / "checkpoints")
    with pytest.raises(TrainError, match=r"num_layers 2 \(checkpoint: 1\).*drop those settings"):
        Trainer(make_cfg(tmp_path, data, max_steps=4, warmup_ratio=0.0, num_layers=2), target=target).run()
    with pytest.raises(TrainError, match=r"scheduler state .* does not fit this run.*init_from="):
        Trainer(make_cfg(tmp_path, data, max_steps=4), target=target).run()  # a warmup the checkpoint's schedule lacks
    assert snapshot(tmp_path / "run" / "checkpoints") == ckpts
    assert Trainer(make_cfg(tmp_path, data, max_steps=4, warmup_ratio=0.0, num_layers=1), target=target).run().step == 4


@pytest.mark.parametrize("code,phrase", [(errno.ENOSPC, "no space left"), (errno.ENOTDIR, "a file stands where"),
                                         (errno.EACCES, "cannot write")])
def test_operating_system_failures_are_one_line(code, phrase):
    import typer

    from flashdraft.cli import guarded

    sub = typer.Typer()

    @sub.command()
    def cmd() -> None:
        raise OSError(code, os.strerror(code), "/data/out/part-1.parquet")

    sub.registered_commands[0].callback = guarded(cmd)
    refused(CliRunner().invoke(sub, []), phrase, "/data/out/part-1.parquet")


def test_other_os_errors_keep_their_traceback():
    import typer

    from flashdraft.cli import guarded

    sub = typer.Typer()

    @sub.command()
    def cmd() -> None:
        raise FileNotFoundError(errno.ENOENT, "gone", "x")

    sub.registered_commands[0].callback = guarded(cmd)
    r = CliRunner().invoke(sub, [])
    assert r.exit_code == 1 and isinstance(r.exception, FileNotFoundError)


# ---- 12-15: conflicts, messages, empty input ------------------------------------------------------------------

def test_conflicting_settings_are_said(tiny_dir, drafter_dir, tmp_path):
    r = invoke("decode", "def f(x):", "--target", tiny_dir, "--method", "ar", "--drafter", drafter_dir, "--budget", "4",
               "--sizing", "cost", "--max-new-tokens", "2")
    assert r.exit_code == 0, r.output
    assert "warning: --method ar ignores --budget, --drafter, --sizing" in r.output
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "def f(x):"}])
    r = invoke("generate", prompts, "--target", tiny_dir, "--backend", "hf", "--max-tokens", "3", "--set",
               "max_tokens=abc", "-o", tmp_path / "g", "--no-progress")
    assert r.exit_code == 0 and "warning: --set max_tokens=abc is overridden by its flag (3)" in r.output, r.output


def test_block_methods_refuse_a_step_wise_drafter():
    from flashdraft.decode import DecodeError, build_decoder
    from flashdraft.models.eagle3 import Eagle3Drafter
    from tests.tiny import tiny_target

    target = tiny_target("qwen3")
    eagle = Eagle3Drafter.for_target(target, max_depth=3, seed=1)
    for method in ("dflash", "ddtree"):
        with pytest.raises(DecodeError, match="drafts token by token: use --method eagle3"):
            build_decoder(method, target, eagle)


def test_messages_name_the_real_cause(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Write a Python function that adds two numbers."}])
    line = refused(invoke("mix", "report", data, "--labels", "foo,bar", "--out", tmp_path / "r"), "--labels")
    assert "head.npz" not in line


def test_generate_refuses_an_empty_source(tiny_dir, tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    refused(invoke("generate", empty, "--target", tiny_dir, "--backend", "hf", "-o", tmp_path / "g"), "holds no rows")


def test_serve_cmd_warns_on_a_folder_export_did_not_write(drafter_dir):
    from flashdraft.models.dflash import DFlashDrafter  # noqa: F401  (the family the folder names)

    r = invoke("serve-cmd", drafter_dir, "--target", "org/model")
    assert r.exit_code == 0 and "warning:" in r.output and "flashdraft export" in r.output
