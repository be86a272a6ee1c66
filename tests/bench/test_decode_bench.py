"""``bench decode`` on a tiny target with a cheap high-acceptance drafter: results, table, plots, errors."""

from __future__ import annotations

import json

import pytest
import torch

from flashdraft.bench.decode_bench import BenchError, load_prompt_set, markdown_table, run_decode_bench
from flashdraft.bench.plots import decode_plots
from tests.tiny import OracleDrafter, random_prompts, tiny_target


class NoisyOracle(OracleDrafter):
    """The target's greedy continuation, wrong at every 3rd draft position (the right token ranks second)."""

    def propose(self, tokens, new_features):
        logits = super().propose(tokens, new_features)  # [B - 1, V]
        for k in range(2, logits.shape[0], 3):
            right = int(logits[k].argmax())
            wrong = (right + 1) % logits.shape[1]
            logits[k, wrong], logits[k, right] = 30.0, 25.0
        return logits


@pytest.fixture(scope="module")
def tiny():
    return tiny_target("qwen3")


def test_decode_bench_tiny(tiny, tmp_path):
    drafter = NoisyOracle(tiny, block_size=8)
    res = run_decode_bench(tiny, {"noisy": drafter}, {"rand": random_prompts(2, 10)}, budgets=[2, 16],
                           temperatures=[0.0], max_new_tokens=12, repeats=2, out_dir=tmp_path, log=lambda m: None)
    assert not res["partial"]
    rows = res["sets"]["rand@T=0"]
    assert set(rows) == {"ar", "noisy/dflash", "noisy/ddtree@2", "noisy/chain@2", "noisy/ddtree@16", "noisy/chain@16",
                         "ngram", "ngram_tree@2", "ngram_tree@16", "noisy/ddtree_ngram@2", "noisy/ddtree_ngram@16"}  # prompt lookup reported next to the drafter
    for v, s in rows.items():
        assert s["identical_to_ar"] == 2, v  # lossless at T = 0
        assert s["tpot_ms"] > 0 and s["speedup"] > 0
        assert set(s["stage_ms_per_round"]) == {"draft", "tree_build", "verify", "commit"}
    assert rows["ar"]["speedup"] == pytest.approx(1.0)
    # drafts 1, 2 right, 3 wrong: a chain accepts 2 (tau 3); the tree recovers the 2nd-ranked token
    assert rows["noisy/dflash"]["tau_mean"] == pytest.approx(3.0, abs=0.5)
    assert rows["noisy/chain@2"]["tau_mean"] == pytest.approx(3.0, abs=0.5)
    assert rows["noisy/ddtree@16"]["tau_mean"] > rows["noisy/dflash"]["tau_mean"]
    acc = rows["noisy/dflash"]["per_position_acceptance"]
    assert len(acc) == 7 and acc[0] >= acc[1] >= acc[2]
    assert 1 <= rows["noisy/ddtree@16"]["spine_rows_mean"] <= 8  # head rows the walk scores per round
    assert sum(rows["noisy/ddtree@16"]["tau_histogram"].values()) == rows["noisy/ddtree@16"]["rounds"]
    assert json.loads((tmp_path / "results.json").read_text())["sets"]["rand@T=0"]["ar"]["prompts"] == 2
    md = markdown_table(res)
    assert "| rand@T=0 | noisy/ddtree@16 |" in md and "no chat template" in md
    pngs = decode_plots(res, tmp_path)
    assert len(pngs) == 2 and all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)


def test_partial_results_survive_a_failure(tiny, tmp_path):
    class Dies(NoisyOracle):
        calls = 0

        def propose(self, tokens, new_features):
            Dies.calls += 1
            if Dies.calls > 14:
                raise RuntimeError("drafter crashed")
            return super().propose(tokens, new_features)

    with pytest.raises(RuntimeError, match="drafter crashed"):
        run_decode_bench(tiny, {"d": Dies(tiny, block_size=4)}, {"rand": random_prompts(3, 8)}, budgets=[2],
                         temperatures=[0.0], max_new_tokens=8, repeats=1, out_dir=tmp_path, warmup=False,
                         log=lambda m: None)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["partial"] is True
    assert 1 <= saved["sets"]["rand@T=0"]["ar"]["prompts"] < 3


def test_prompt_sets(tmp_path):
    name, prompts = load_prompt_set("humaneval", limit=3)
    assert name == "humaneval" and len(prompts) == 3 and "def " in prompts[0]
    p = tmp_path / "mine.jsonl"
    p.write_text('{"prompt": "hello"}\n\n{"prompt": "world", "x": 1}\n')
    assert load_prompt_set(str(p)) == ("mine", ["hello", "world"])
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(BenchError, match="is empty"):
        load_prompt_set(str(tmp_path / "empty.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(BenchError, match="no string 'prompt' field"):
        load_prompt_set(str(tmp_path / "bad.jsonl"))
    with pytest.raises(BenchError, match="neither a named set .*code-test.*'humaneval', nor an existing JSONL"):
        load_prompt_set(str(tmp_path / "missing.jsonl"))


def test_temperature_one_runs(tiny, tmp_path):
    torch.manual_seed(0)
    res = run_decode_bench(tiny, {"n": NoisyOracle(tiny, block_size=4)}, {"r": random_prompts(1, 8)}, budgets=[4],
                           temperatures=[1.0], max_new_tokens=8, repeats=2, out_dir=tmp_path, log=lambda m: None)
    assert res["sets"]["r@T=1"]["n/ddtree@4"]["rounds"] > 0


def test_decode_bench_without_a_drafter_compares_ar_and_prompt_lookup(tiny, tmp_path):
    prompts = [p[:6] * 3 for p in random_prompts(2, 10, seed=3)]  # repetitive: the lookup hits
    res = run_decode_bench(tiny, {}, {"rep": prompts}, budgets=[8], temperatures=[0.0], max_new_tokens=16,
                           repeats=1, out_dir=tmp_path, log=lambda m: None)
    rows = res["sets"]["rep@T=0"]
    assert set(rows) == {"ar", "ngram", "ngram_tree@8"}
    assert all(s["identical_to_ar"] == 2 for s in rows.values())
    assert len(rows["ngram"]["per_position_acceptance"]) == 7  # no drafter: a chain of 7
    assert rows["ngram_tree@8"]["tau_mean"] >= 1.0
    with pytest.raises(BenchError, match="--drafter"):
        run_decode_bench(tiny, {}, {"rep": prompts}, budgets=[8], temperatures=[0.0], max_new_tokens=4,
                         repeats=1, out_dir=tmp_path, log=lambda m: None, ngram=False)
