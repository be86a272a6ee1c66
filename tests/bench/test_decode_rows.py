"""The rows ``bench decode`` gives a drafter come from its family; drafter row names stay distinct."""

from __future__ import annotations

import pytest

from flashdraft.bench.decode_bench import (BenchError, decode_methods, drafter_names, markdown_table, run_decode_bench,
                                          variants)
from flashdraft.bench.plots import decode_plots
from flashdraft.models.dflash import DFlashDrafter
from flashdraft.models.eagle3 import Eagle3Drafter
from tests.tiny import MASK_ID, Eagle3Oracle, OracleDrafter, random_prompts, tiny_target


@pytest.fixture(scope="module")
def tiny():
    return tiny_target("qwen3")


def test_a_drafter_without_decode_methods_gets_the_dflash_rows(tiny):
    d = OracleDrafter(tiny, block_size=4)
    assert decode_methods(d) == ("dflash", "ddtree")
    rows = variants(tiny, {"o": d}, [2, 8], ngram=False)
    assert set(rows) == {"ar", "o/dflash", "o/ddtree@2", "o/chain@2", "o/ddtree@8", "o/chain@8"}


def test_cost_sizing_and_lookup_options_reach_their_rows(tiny):
    d = OracleDrafter(tiny, block_size=4)
    rows = variants(tiny, {"o": d}, [8], lookup={"lookup_min": 2, "lookup_max": 3}, sizings=["fixed", "cost"])
    assert set(rows) == {"ar", "ngram", "ngram_tree@8", "o/dflash", "o/ddtree@8", "o/chain@8", "o/ddtree_ngram@8",
                         "o/ddtree@8+cost", "o/ddtree_ngram@8+cost"}
    assert rows["o/ddtree@8+cost"].sizing == "cost" and rows["o/ddtree@8"].sizing == "fixed"
    assert rows["ngram"].drafter.min_n == 2 and rows["o/ddtree_ngram@8+cost"].drafter.lookup.min_n == 2
    eagle = Eagle3Oracle.for_target(tiny, max_depth=3)  # a tree method without sizing keeps its one row
    assert set(variants(tiny, {"e": eagle}, [8], ngram=False, sizings=["fixed", "cost"])) == {
        "ar", "e/eagle3", "e/eagle3_tree@8"}


def test_a_family_names_its_chain_and_tree(tiny):
    class HybridOnly(OracleDrafter):
        decode_methods = ("dflash", "ddtree_ngram")  # a tree method without controls of its own

    rows = variants(tiny, {"h": HybridOnly(tiny, block_size=4), "o": OracleDrafter(tiny, block_size=4)}, [4])
    assert set(rows) == {"ar", "ngram", "ngram_tree@4", "h/dflash", "h/ddtree_ngram@4",
                         "o/dflash", "o/ddtree@4", "o/chain@4", "o/ddtree_ngram@4"}
    assert rows["h/ddtree_ngram@4"].budget == 4


def test_eagle3_rows_run_next_to_dflash_in_one_interleaved_run(tiny, tmp_path):
    eagle = Eagle3Oracle.for_target(tiny, max_depth=4)
    assert decode_methods(eagle) == ("eagle3", "eagle3_tree")
    res = run_decode_bench(tiny, {"d": OracleDrafter(tiny, block_size=5), "e": eagle}, {"rand": random_prompts(2, 10)},
                           budgets=[3, 12], temperatures=[0.0], max_new_tokens=12, repeats=1, out_dir=tmp_path,
                           log=lambda m: None, ngram=False)
    rows = res["sets"]["rand@T=0"]
    assert set(rows) == {"ar", "d/dflash", "d/ddtree@3", "d/chain@3", "d/ddtree@12", "d/chain@12",
                         "e/eagle3", "e/eagle3_tree@3", "e/eagle3_tree@12"}
    assert res["drafters"]["e"] == {"chain": "eagle3", "tree": "eagle3_tree", "block_size": 5}
    assert res["drafters"]["d"] == {"chain": "dflash", "tree": "ddtree", "block_size": 5}
    for v, s in rows.items():
        assert s["identical_to_ar"] == 2, v  # lossless at T = 0
    # the oracle's 4 drafts all accepted: rounds of 5, 5 and the last cut to 1 (12 tokens, 1 from the prefill)
    assert rows["e/eagle3"]["tau_mean"] == pytest.approx(11 / 3)
    assert len(rows["e/eagle3"]["per_position_acceptance"]) == 4
    assert rows["e/eagle3_tree@12"]["tau_mean"] > rows["e/eagle3_tree@3"]["tau_mean"] > 1
    assert "| rand@T=0 | e/eagle3_tree@12 |" in markdown_table(res)
    assert any(p.name == "budget_rand@T0_e.png" for p in decode_plots(res, tmp_path))


def test_a_random_eagle3_drafter_gets_its_rows_losslessly(tiny, tmp_path):
    d = Eagle3Drafter.for_target(tiny, max_depth=3, seed=4)
    res = run_decode_bench(tiny, {"r": d}, {"rand": random_prompts(2, 8, seed=1)}, budgets=[6], temperatures=[0.0],
                           max_new_tokens=10, repeats=1, out_dir=tmp_path, log=lambda m: None)
    rows = res["sets"]["rand@T=0"]
    assert set(rows) == {"ar", "ngram", "ngram_tree@6", "r/eagle3", "r/eagle3_tree@6"}
    assert all(s["identical_to_ar"] == 2 for s in rows.values())


def test_drafter_names_are_distinct(tmp_path):
    a, b, c = tmp_path / "runs" / "a" / "final", tmp_path / "runs" / "b" / "final", tmp_path / "other"
    assert drafter_names([str(c)]) == ["other"]
    assert drafter_names([str(a), str(b), str(c)]) == ["a-final", "b-final", "other"]
    with pytest.raises(BenchError, match="given twice"):
        drafter_names([str(a), str(tmp_path / "runs" / "a" / "." / "final")])


def test_cost_rows_run_losslessly_and_report_the_cost_table(tiny, tmp_path):
    tiny._verify_costs = {}
    res = run_decode_bench(tiny, {"o": OracleDrafter(tiny, block_size=4)}, {"rand": random_prompts(2, 8, seed=2)},
                           budgets=[6], temperatures=[0.0], max_new_tokens=10, repeats=1, out_dir=tmp_path,
                           log=lambda m: None, sizings=["fixed", "cost"])
    rows = res["sets"]["rand@T=0"]
    assert {"o/ddtree@6+cost", "o/ddtree_ngram@6+cost"} <= set(rows)
    assert all(s["identical_to_ar"] == 2 for s in rows.values())
    body, head = res["verify_cost_ms"]["body"], res["verify_cost_ms"]["head"]
    assert len(body) == 7 and len(head) == 4 and all(c > 0 for c in body + head)  # 6 nodes + root; depth 3 + root
    assert "verify cost the +cost rows sized by (ms): body for n tokens 1: " in markdown_table(res)
    assert res["sizings"] == ["fixed", "cost"]
    decode_plots(res, tmp_path)  # "@6+cost" rows stay out of the budget plots instead of breaking them


def test_hints_give_each_dflash_drafter_rows_per_mode(tiny, tmp_path):
    """``--hints lookup,none``: one set of rows per block-hints mode, every decoder of a set drafting with
    that mode, all lossless; a family without block hints (EAGLE-3) and a mode named twice are refused."""
    d = DFlashDrafter.for_target(tiny, num_layers=1, block_size=4, mask_token_id=MASK_ID, seed=3)
    rows = variants(tiny, {"g": d}, [6], lookup={}, sizings=["fixed", "cost"], hints=["lookup", "none"])
    for h in ("lookup", "none"):
        mine = {v: dec for v, dec in rows.items() if v.startswith(f"g+hints={h}/")}
        assert {v.split("/", 1)[1] for v in mine} == {"dflash", "ddtree@6", "chain@6", "ddtree_ngram@6",
                                                      "ddtree@6+cost", "ddtree_ngram@6+cost"}
        assert all(dec.hints == h for dec in mine.values())
    prompts = [random_prompts(1, 6, seed=5)[0] * 3]  # repeats: lookup has something to hint
    res = run_decode_bench(tiny, {"g": d}, {"rep": prompts}, budgets=[6], temperatures=[0.0], max_new_tokens=12,
                           repeats=1, out_dir=tmp_path, log=lambda m: None, ngram=False, hints=["lookup", "none"])
    assert res["drafters"]["g+hints=none"] == {"chain": "dflash", "tree": "ddtree", "block_size": 4, "hints": "none"}
    assert all(s["identical_to_ar"] == 1 for s in res["sets"]["rep@T=0"].values())
    assert any(p.name == "budget_rep@T0_g+hints-none.png" for p in decode_plots(res, tmp_path))
    # a drafter without block hints gets its one set of rows next to the hint modes of the others
    both = variants(tiny, {"g": d, "e": Eagle3Oracle.for_target(tiny, max_depth=3)}, [4], hints=["lookup", "none"])
    assert {"e/eagle3", "e/eagle3_tree@4", "g+hints=none/dflash", "g+hints=lookup/dflash"} <= set(both)
    assert not any(v.startswith("e+hints") for v in both)
    with pytest.raises(BenchError, match="names a mode twice"):
        variants(tiny, {"g": d}, [4], hints=["none", "none"])


def test_rows_keeps_ar_and_the_matching_rows_only(tiny, tmp_path):
    from flashdraft.bench.decode_bench import select_rows

    d = DFlashDrafter.for_target(tiny, num_layers=1, block_size=4, mask_token_id=MASK_ID, seed=3)
    all_rows = variants(tiny, {"g": d}, [6], lookup={}, hints=["lookup", "none"])
    kept = select_rows(all_rows, ["ngram", "*/dflash"])
    assert set(kept) == {"ar", "ngram", "g+hints=lookup/dflash", "g+hints=none/dflash"}
    with pytest.raises(BenchError, match="matches no row"):
        select_rows(all_rows, ["*/medusa"])
    res = run_decode_bench(tiny, {"g": d}, {"r": random_prompts(1, 8)}, budgets=[6], temperatures=[0.0],
                           max_new_tokens=8, repeats=1, out_dir=tmp_path, log=lambda m: None, hints=["none"],
                           rows=["*/dflash"])
    assert set(res["sets"]["r@T=0"]) == {"ar", "g+hints=none/dflash"}
    assert "| r@T=0 | g+hints=none/dflash |" in markdown_table(res)
    decode_plots(res, tmp_path)


def test_draft_vocabulary_coverage_by_hand(tiny, tmp_path):
    """Coverage of a tiny corpus worked out by hand, then the bench's own figure for a reduced-vocabulary drafter."""
    import torch

    from flashdraft.models.draft_vocab import vocab_coverage

    t2d = torch.tensor([True, False, True, True])
    c = vocab_coverage(t2d, [[0, 2, 1, 3], [3, 3]], max_run=3)
    # 5 of 6 tokens inside; runs of 2: (0,2) (2,1) (1,3) (3,3) -> 2 of 4; runs of 3: (0,2,1) (2,1,3) -> 0 of 2
    assert c["tokens"] == 6 and c["share"] == 5 / 6 and c["runs"] == [5 / 6, 0.5, 0.0]
    ids = torch.arange(0, 40)
    d = DFlashDrafter.for_target(tiny, num_layers=1, block_size=4, mask_token_id=MASK_ID, seed=3, draft_vocab=ids)
    res = run_decode_bench(tiny, {"g": d}, {"r": random_prompts(2, 8)}, budgets=[4], temperatures=[0.0],
                           max_new_tokens=10, repeats=1, out_dir=tmp_path, log=lambda m: None, ngram=False,
                           rows=["*/dflash"])
    cov = res["vocab_coverage"]["r@T=0"]["g"]
    assert cov["tokens"] == 20 and len(cov["runs"]) == 3 and cov["runs"][0] == cov["share"]
    assert "draft vocabulary holds" in markdown_table(res)
