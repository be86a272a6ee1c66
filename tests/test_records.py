"""One reader: the same records in every layout and file kind give the same messages in generate, mix and train."""

from __future__ import annotations

import json

import pytest

from flashdraft.generate.sources import BadInput, SourceError, load_source, read_source
from flashdraft.mix.domains import MixError
from flashdraft.mix.records import iter_samples, to_sample
from flashdraft.records import RecordError, parse_row, read_prompts
from flashdraft.train.data import read_samples

USER = {"role": "user", "content": "Sum 2 and 2."}
ANSWER = {"role": "assistant", "content": "4"}
CALL = {"id": "t1", "type": "function", "function": {"name": "calc", "arguments": {"expr": "2+2"}}}

# layout -> (two rows, the messages every reader must give for each row)
LAYOUTS = {
    "sharegpt": (
        [{"conversations": [{"from": "human", "value": "Sum 2 and 2."}, {"from": "gpt", "value": "4"}]},
         {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"}]}],
        [[USER, ANSWER], [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]],
    ),
    "openai": (
        [{"messages": [{"role": "user", "content": "Sum 2 and 2."}, {"role": "assistant", "content": "4"}]},
         {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}],
        [[USER, ANSWER], [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]],
    ),
    "prompt": (
        [{"prompt": "Sum 2 and 2.", "response": "4"}, {"prompt": "Hi", "response": "Hello"}],
        [[USER, ANSWER], [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]],
    ),
    "alpaca": (
        [{"instruction": "Sum 2 and 2.", "input": "", "output": "4"},
         {"instruction": "Sum", "input": "2 2", "output": "4"}],
        [[USER, ANSWER], [{"role": "user", "content": "Sum\n\n2 2"}, ANSWER]],
    ),
    "anthropic": (
        [{"messages": [
            {"role": "user", "content": [{"type": "text", "text": "Sum 2 and 2."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Calling."},
                                              {"type": "tool_use", "id": "t1", "name": "calc",
                                               "input": {"expr": "2+2"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "4"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "4"}]}]}],
        [[USER, {"role": "assistant", "content": "Calling.", "tool_calls": [CALL]},
          {"role": "tool", "content": "4", "tool_call_id": "t1"}, ANSWER]],
    ),
}


def _write(kind: str, folder, rows: list[dict]):
    """The rows as a file (or folder) of the given kind."""
    if kind == "jsonl":
        path = folder / "data.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        path = folder / "data.json"
        path.write_text(json.dumps(rows))
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = folder / "data.parquet"
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        import datasets

        path = folder / "data"
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


def _strip_nulls(value):
    """Parquet and datasets give every struct all the fields of its column (None where a row had none)."""
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet", "save_to_disk"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_generate_mix_and_train_read_the_same_messages(tmp_path, layout, kind):
    rows, want = LAYOUTS[layout]
    path = _write(kind, tmp_path, rows)
    gen = [s.messages for s in read_source(str(path))]
    mix = [s.messages for batch in iter_samples(path) for s in batch]
    train = [s.messages for _, s in read_samples(path)]
    assert [_strip_nulls(m) for m in gen] == want
    assert [_strip_nulls(m) for m in mix] == want
    assert [_strip_nulls(m) for m in train] == want
    if layout == "anthropic":  # mix's text keeps the call and the result for its signals
        s = next(iter(iter_samples(path)))[0]
        assert '"type": "tool_use"' in s.prompt and '"tool_result"' in s.prompt and s.response == "4"
        # generate cannot replay tool turns: the row is skipped with the reason
        (bad,) = list(load_source(str(path)))
        assert isinstance(bad, BadInput) and "role 'tool'" in bad.detail


def test_a_bad_row_is_named_by_file_and_line_in_every_reader(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "response": "b"}\n{oops\n{"messages": [{"content": "no role"}]}\n')
    with pytest.raises(MixError, match=r"bad.jsonl:2 is not valid JSON"):  # mix's errors are RecordErrors too
        list(iter_samples(path))
    with pytest.raises(RecordError, match=r"bad.jsonl:2 is not valid JSON"):
        list(read_samples(path))
    got = list(read_source(str(path)))
    assert isinstance(got[1], BadInput) and got[1].id == "bad:line2" and got[1].detail.startswith("line 2: is not valid")
    assert isinstance(got[2], BadInput) and "line 3: has a turn without 'role'" in got[2].detail
    path.write_text('{"prompt": "a", "response": "b"}\n{"messages": [{"content": "no role"}]}\n')
    for read in (lambda: list(iter_samples(path)), lambda: list(read_samples(path))):
        with pytest.raises(RecordError, match=r"bad.jsonl:2 has a turn without 'role'/'content'.*give every turn a role"):
            read()


def test_suffix_rules(tmp_path):
    # .json: one document, a list of records or one record object
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"prompt": "p", "response": "r"}))
    assert [s.messages for _, s in read_samples(one)] == [[{"role": "user", "content": "p"},
                                                           {"role": "assistant", "content": "r"}]]
    lines = tmp_path / "lines.json"
    lines.write_text('{"prompt": "p"}\n{"prompt": "q"}\n')
    with pytest.raises(MixError, match=r"lines.json is not one JSON document.*\.jsonl"):
        list(iter_samples(lines))
    with pytest.raises(SourceError, match=r"lines.json is not one JSON document"):
        list(read_source(str(lines)))
    (tmp_path / "x.csv").write_text("a,b\n")
    for read in (lambda: list(iter_samples(tmp_path / "x.csv")), lambda: list(read_samples(tmp_path / "x.csv"))):
        with pytest.raises(RecordError, match="unknown file type '.csv'"):
            read()


def test_roles_text_parts_and_prompt_sets(tmp_path):
    s = parse_row({"messages": [{"role": "Human", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                                {"role": "model", "content": None, "tool_calls": [CALL]}]})
    assert s.messages == [{"role": "user", "content": "a\nb"},
                          {"role": "assistant", "content": "", "tool_calls": [CALL]}]
    assert to_sample({"question": "q", "answer": "a"}, "x", 0).messages == [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    p = tmp_path / "prompts.jsonl"
    p.write_text('{"prompt": "def f():"}\n{"prompt_ids": [1, 2]}\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert [x for _, x in read_prompts(p)] == ["def f():", [1, 2], "hi"]
    assert [x for _, x in read_prompts(p, limit=1)] == ["def f():"]
