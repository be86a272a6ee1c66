"""The rows ``bench decode`` gives a drafter come from its family; drafter row names stay distinct."""

from __future__ import annotations

import pytest

from flashdraft.bench.decode_bench import BenchError, decode_methods, drafter_names, variants
from tests.tiny import OracleDrafter, tiny_target


@pytest.fixture(scope="module")
def tiny():
    return tiny_target("qwen3")


def test_a_drafter_without_decode_methods_gets_the_dflash_rows(tiny):
    d = OracleDrafter(tiny, block_size=4)
    assert decode_methods(d) == ("dflash", "ddtree")
    rows = variants(tiny, {"o": d}, [2, 8], ngram=False)
    assert set(rows) == {"ar", "o/dflash", "o/ddtree@2", "o/chain@2", "o/ddtree@8", "o/chain@8"}


def test_a_family_names_its_chain_and_tree(tiny):
    class HybridOnly(OracleDrafter):
        decode_methods = ("dflash", "ddtree_ngram")  # a tree method without controls of its own

    rows = variants(tiny, {"h": HybridOnly(tiny, block_size=4), "o": OracleDrafter(tiny, block_size=4)}, [4])
    assert set(rows) == {"ar", "ngram", "ngram_tree@4", "h/dflash", "h/ddtree_ngram@4",
                         "o/dflash", "o/ddtree@4", "o/chain@4", "o/ddtree_ngram@4"}
    assert rows["h/ddtree_ngram@4"].budget == 4


def test_drafter_names_are_distinct(tmp_path):
    a, b, c = tmp_path / "runs" / "a" / "final", tmp_path / "runs" / "b" / "final", tmp_path / "other"
    assert drafter_names([str(c)]) == ["other"]
    assert drafter_names([str(a), str(b), str(c)]) == ["a-final", "b-final", "other"]
    with pytest.raises(BenchError, match="given twice"):
        drafter_names([str(a), str(tmp_path / "runs" / "a" / "." / "final")])
