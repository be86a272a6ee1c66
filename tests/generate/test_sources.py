"""Prompt sources: layouts, ids, bad rows, built-in offline sets."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flashdraft.generate.sources import BadInput, Sample, SourceError, load_source
from tests.generate.conftest import write_jsonl

ROWS = [
    {"id": "a", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"},
                                  {"from": "human", "value": "More"}]},
    {"conversations": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]},
]


def test_layouts_and_ids(tmp_path):
    sg = list(load_source(str(write_jsonl(tmp_path / "sg.jsonl", ROWS))))
    assert [s.id for s in sg][0] == "sg:a" and sg[1].id.startswith("sg:") and len(sg[1].id) == 3 + 20
    assert sg[0].messages[1] == {"role": "assistant", "content": "Hello"}
    assert sg[1].messages[0]["role"] == "system"
    oa = list(load_source(f"chat={write_jsonl(tmp_path / 'oa.jsonl', [{'messages': [{'role': 'user', 'content': [{'type': 'text', 'text': 'x'}]}]}])}"))
    assert oa[0].source == "chat" and oa[0].messages == [{"role": "user", "content": "x"}]
    ins = list(load_source(str(write_jsonl(tmp_path / "ins.jsonl", [{"instruction": "Sum", "input": "1 2"}]))))
    assert ins[0].messages[0]["content"] == "Sum\n\n1 2"
    # the same prompt read twice gets the same id (content hash), whatever the row order
    again = list(load_source(str(write_jsonl(tmp_path / "sg.jsonl", ROWS[::-1]))))
    assert {s.id for s in again} == {s.id for s in sg}


def test_parquet_and_datasets_folder(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"prompt": "p1"}, {"prompt": "p2"}]), tmp_path / "p.parquet")
    assert [s.messages[0]["content"] for s in load_source(str(tmp_path / "p.parquet"))] == ["p1", "p2"]
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[1:] * 2)}).save_to_disk(str(tmp_path / "ds"))
    got = list(load_source(str(tmp_path / "ds")))
    assert len(got) == 2 and got[0].source == "ds" and got[0].id == got[1].id  # duplicates share the hash id


def test_bad_rows_and_unknown_layout(tmp_path):
    f = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "ok"}, "{not json", {"messages": []},
                                              {"messages": [{"role": "tool", "content": "x"}]}, {"text": "?"}])
    got = list(load_source(str(f)))
    bad = [g for g in got if isinstance(g, BadInput)]
    assert [b.reason for b in bad] == ["malformed", "empty_conversation", "malformed", "malformed"]
    assert "line 2" in bad[0].detail and "role 'tool'" in bad[2].detail
    assert sum(isinstance(g, Sample) for g in got) == 1
    with pytest.raises(SourceError, match=r"keys found: \['text', 'title'\].*conversations"):
        list(load_source(str(write_jsonl(tmp_path / "u.jsonl", [{"text": "a", "title": "b"}]))))
    with pytest.raises(SourceError, match="neither a file"):
        list(load_source(str(tmp_path / "missing.jsonl")))


def test_builtin_offline_sources():
    code = list(load_source("stdlib-code", limit=5))
    assert len(code) == 5 and all(s.messages[0]["content"].lstrip().startswith(("def ", "async def")) for s in code)
    assert all(s.id.startswith("stdlib-code:") for s in code)
    assert len(list(load_source("stdlib-docs", limit=3))) == 3
    with pytest.raises(SourceError, match="held out"):
        list(load_source("humaneval"))
    he = list(load_source("humaneval", limit=2, include_heldout=True))
    assert he[0].id == "humaneval:HumanEval/0"
