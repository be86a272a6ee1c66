"""The ``openai`` backend against real local servers with injected 503s and timeouts: nothing lost."""

from __future__ import annotations

from flashdraft.generate.config import GenerateConfig
from flashdraft.generate.output import read_errors, read_records
from flashdraft.generate.runner import run
from tests.generate.completion_server import CompletionServer
from tests.generate.conftest import write_jsonl

POISON = "def poison():"


def test_openai_round_robin_retries_and_errors(tmp_path, tiny_chat_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_chat_dir)
    text = tok.apply_chat_template([{"role": "user", "content": POISON}], add_generation_prompt=True, tokenize=False)
    poison_ids = tok(text, add_special_tokens=False)["input_ids"]
    cured = {"flag": False}

    def fault(ids, attempt):
        if ids == poison_ids and not cured["flag"]:
            return "503"  # always fails: must end in the error file
        if attempt == 1:
            return ("503", "timeout", None)[sum(ids) % 3]
        return None

    rows = [{"id": i, "prompt": f"def f{i}(x):"} for i in range(10)] + [{"id": "poison", "prompt": POISON}]
    rows.append({"id": "multi", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"},
                                             {"role": "user", "content": "more"}]})
    src = write_jsonl(tmp_path / "p.jsonl", rows)
    common = dict(sources=[str(src)], target=str(tiny_chat_dir), max_tokens=5, progress=False, flush_every=4,
                  dtype="float32")
    with CompletionServer(tiny_chat_dir, fault, hang_s=1.5) as a, CompletionServer(tiny_chat_dir, fault, hang_s=1.5) as b:
        cfg = GenerateConfig(backend="openai", servers=[a.url, b.url], output=str(tmp_path / "api"), concurrency=3,
                             request_timeout=1.0, max_retries=3, retry_backoff=0.01, **common)
        m = run(cfg)
        assert m["counts"]["done"] == 11 and m["counts"]["failed"] == 1
        errs = read_errors(cfg.output)
        assert [(e["id"], e["reason"]) for e in errs] == [("p:poison", "generation_failed")]
        assert "HTTP 503" in errs[0]["detail"] and "gave up after 3 retries" in errs[0]["detail"]
        assert a.served > 0 and b.served > 0  # round-robin over both servers
        assert sum(a.attempts.values()) + sum(b.attempts.values()) > a.served + b.served  # faults were retried
        cured["flag"] = True
        m2 = run(cfg.model_copy(update={"resume": True}))
        assert m2["counts"]["done"] == 1 and m2["counts"]["skipped_done"] == 11
    api = {r["id"]: r for r in read_records(cfg.output).to_pylist()}
    assert sorted(api) == sorted([f"p:{i}" for i in range(10)] + ["p:poison", "p:multi"])  # every prompt once
    # the same greedy answers as the in-process backend on the same model
    local = run(GenerateConfig(backend="hf", output=str(tmp_path / "hf"), batch_size=1, **common))
    assert local["counts"]["done"] == 12
    for r in read_records(tmp_path / "hf").to_pylist():
        assert api[r["id"]]["token_ids"] == r["token_ids"] and api[r["id"]]["loss_mask"] == r["loss_mask"]
