"""End to end with the ``hf`` backend on a tiny random model: records, masks, bad input, resume, shards, CLI."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from flashdraft.generate.cli import generate
from flashdraft.generate.config import GenerateConfig
from flashdraft.generate.output import OutputError, read_errors, read_records
from flashdraft.generate.runner import run
from tests.generate.conftest import write_jsonl

CONVS = [
    {"id": "two", "messages": [{"role": "user", "content": "def add(a, b):"}, {"role": "assistant", "content": "old"},
                               {"role": "user", "content": "and now subtract"}, {"role": "assistant", "content": "x"}]},
    {"id": "one", "prompt": "The text wrapper"},
    {"id": "dup", "prompt": "The text wrapper"},  # identical prompt: deduplicated
    "{broken json",
    {"id": "empty", "messages": [{"role": "user", "content": "   "}]},
    {"id": "long", "prompt": "word " * 300},
]


def cfg_for(tmp_path, model_dir, out="out", **kw) -> GenerateConfig:
    src = write_jsonl(tmp_path / "convs.jsonl", CONVS)
    base = dict(sources=[f"chat={src}"], target=str(model_dir), backend="hf", dtype="float32", max_tokens=6,
                output=str(tmp_path / out), max_model_len=128, batch_size=2, progress=False, flush_every=1)
    base.update(kw)
    return GenerateConfig(**base)


def test_chat_records_masks_and_errors(tmp_path, tiny_chat_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = run(cfg_for(tmp_path, tiny_chat_dir))
    assert m["counts"]["done"] == 2 and m["counts"]["duplicates"] == 1 and m["finished"]
    assert m["counts"]["bad_malformed"] == 1 and m["counts"]["bad_empty_conversation"] == 1
    assert m["counts"]["bad_prompt_too_long"] == 1 and m["tokens"]["response"] == 18
    errs = {e["id"]: e for e in read_errors(tmp_path / "out")}
    assert errs["chat:long"]["reason"] == "prompt_too_long" and "context window 128" in errs["chat:long"]["detail"]
    assert errs["chat:line4"]["reason"] == "malformed" and errs["chat:empty"]["reason"] == "empty_conversation"

    recs = {r["id"]: r for r in read_records(tmp_path / "out").to_pylist()}
    assert set(recs) == {"chat:two", "chat:one"}
    r = recs["chat:two"]
    tok = AutoTokenizer.from_pretrained(tiny_chat_dir)
    assert [m["role"] for m in r["messages"]] == ["user", "assistant", "user", "assistant"]
    assert r["messages"][1]["content"] != "old" and r["response"] == r["messages"][3]["content"]
    assert len(r["token_ids"]) == len(r["loss_mask"]) and sum(r["loss_mask"]) == 12 and r["num_turns"] == 2
    # the prompt part is the chat template's rendering, so training needs no re-tokenisation
    first = tok.apply_chat_template(r["messages"][:1], add_generation_prompt=True, tokenize=False)
    n0 = r["loss_mask"].index(1)
    assert r["token_ids"][:n0] == tok(first, add_special_tokens=False)["input_ids"]
    # the second answer is the target's greedy answer to exactly the ids before it (its own first answer included)
    model = AutoModelForCausalLM.from_pretrained(tiny_chat_dir)
    n1 = len(r["loss_mask"]) - 6
    assert r["loss_mask"][n1:] == [1] * 6 and r["loss_mask"][n1 - 1] == 0
    import torch

    ref = model.generate(torch.tensor([r["token_ids"][:n1]]), max_new_tokens=6, do_sample=False,
                         eos_token_id=[2, 4], pad_token_id=0)[0, n1:].tolist()
    assert ref[: len(r["token_ids"]) - n1] == r["token_ids"][n1:]


def test_plain_continuation_resume_and_shards(tmp_path, tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    cfg = cfg_for(tmp_path, tiny_dir, max_turns=1)
    m = run(cfg)
    recs = {r["id"]: r for r in read_records(cfg.output).to_pylist()}
    r = recs["chat:one"]
    n0 = r["loss_mask"].index(1)
    assert r["token_ids"][:n0] == tok("The text wrapper")["input_ids"]  # BOS + prompt, no template
    assert recs["chat:two"]["num_turns"] == 1 and m["counts"]["done"] == 2
    with pytest.raises(OutputError, match="--resume"):
        run(cfg)
    cfg2 = cfg.model_copy(update={"resume": True})
    m2 = run(cfg2)
    assert m2["counts"].get("done", 0) == 0 and m2["counts"]["skipped_done"] == 2
    assert len(read_errors(cfg.output)) == 3  # bad rows already recorded are not written twice
    with pytest.raises(OutputError, match=r"max_tokens: 6 -> 7"):
        run(cfg2.model_copy(update={"max_tokens": 7}))  # resuming with other settings would mix records
    per_shard = []
    for i in range(2):  # two machines share one folder: disjoint shards, together everything
        before = len(read_records(tmp_path / "sharded")) if i else 0
        run(cfg.model_copy(update={"num_shards": 2, "shard_index": i, "output": str(tmp_path / "sharded"),
                                   "resume": True}))
        per_shard.append(len(read_records(tmp_path / "sharded")) - before)
    assert sorted(read_records(tmp_path / "sharded").column("id").to_pylist()) == sorted(recs)
    assert sum(per_shard) == 2


def test_data_parallel_workers(tmp_path, tiny_dir):
    cfg = cfg_for(tmp_path, tiny_dir, data_parallel=2, max_turns=1)
    m = run(cfg)
    t = read_records(cfg.output)
    assert sorted(t.column("id").to_pylist()) == ["chat:one", "chat:two"] and m["num_workers"] == 2
    assert m["counts"]["done"] == 2 and m["counts"]["bad_malformed"] == 1
    assert len(read_errors(cfg.output)) == 3  # each bad row reported by exactly one worker


def test_cli(tmp_path, tiny_dir):
    app = typer.Typer()
    app.command()(generate)
    src = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "def f():"}, {"prompt": "class A:"}])
    args = [str(src), "--target", str(tiny_dir), "--backend", "hf", "--dtype", "float32", "--max-tokens", "3",
            "-o", str(tmp_path / "o"), "--no-progress", "--estimate-prompts", "1000"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "done 2" in res.output and "1000 more prompts take" in res.output
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["counts"]["done"] == 2
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "--resume" in res.output
    bad = write_jsonl(tmp_path / "u.jsonl", [{"text": "x"}])
    res = CliRunner().invoke(app, [str(bad), "--target", str(tiny_dir), "--backend", "hf", "-o", str(tmp_path / "u")])
    assert res.exit_code == 2 and "keys found: ['text']" in res.output


def test_hf_hands_the_backend_small_chunks_so_a_kill_loses_little(tmp_path, tiny_dir, monkeypatch):
    """hf runs a chunk batch after batch and records are written after each chunk (whatever flush_every says):
    by default a chunk is one batch (not 1024 prompts), so a run killed in its second batch keeps the first
    batch's records and --resume writes only the rest."""
    from flashdraft.generate.backends.hf import HFBackend

    src = write_jsonl(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"def f{i}(x):"} for i in range(7)])
    cfg = GenerateConfig(sources=[str(src)], target=str(tiny_dir), backend="hf", dtype="float32", max_tokens=4,
                         output=str(tmp_path / "out"), batch_size=2, progress=False, chat_template="never")
    assert cfg.backend_chunk_size == 2 and GenerateConfig(sources=[str(src)], target=str(tiny_dir)).backend_chunk_size == 1024
    real, calls = HFBackend.generate, []

    def dies_in_second_chunk(self, requests):
        calls.append(len(requests))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the run is killed while the second chunk generates
        return real(self, requests)

    monkeypatch.setattr(HFBackend, "generate", dies_in_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        run(cfg)
    assert calls == [2, 2] and len(read_records(cfg.output)) == 2
    monkeypatch.setattr(HFBackend, "generate", real)
    m = run(cfg.model_copy(update={"resume": True}))
    assert m["counts"]["done"] == 5 and m["counts"]["skipped_done"] == 2
    assert sorted(read_records(cfg.output).column("id").to_pylist()) == sorted(f"{src.stem}:p{i}" for i in range(7))
