import json

import pytest

from flashdraft.mix.domains import MixError
from flashdraft.mix.records import iter_samples, to_sample


def test_layouts_are_normalised():
    s = to_sample({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}, "x", 0)
    assert (s.prompt, s.response) == ("<|user|>\nhi", "hello")
    s = to_sample({"instruction": "Sum", "input": "1 2", "output": "3"}, "x", 0)
    assert (s.prompt, s.response) == ("Sum\n\n1 2", "3")
    s = to_sample({"messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]},
                                {"role": "assistant", "content": "a"}]}, "x", 0)
    assert s.response == "a" and "q" in s.prompt
    # flashdraft generate rows: messages are the prompt, response separate, token counts from token_ids/loss_mask
    s = to_sample({"source": "gen", "id": "7", "messages": [{"role": "user", "content": "q"}], "response": "r",
                   "token_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}, "x", 0)
    assert (s.source, s.id, s.response, s.n_tokens, s.n_response_tokens) == ("gen", "7", "r", 4, 2)


def test_tools_are_part_of_the_prompt():
    s = to_sample({"prompt": "q", "response": "r", "tools": [{"name": "f"}]}, "x", 0)
    assert s.prompt.startswith("<|tools|>") and '"name": "f"' in s.prompt


def test_unknown_layout_names_the_fields():
    with pytest.raises(MixError, match=r"none of the known fields.*'foo'"):
        to_sample({"foo": 1}, "x", 0)


def test_jsonl_errors_name_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "a", "response": "b"}\n{oops\n')
    with pytest.raises(MixError, match=r"bad.jsonl:2 is not valid JSON"):
        list(iter_samples(p))


def test_missing_and_unknown_paths(tmp_path):
    with pytest.raises(MixError, match="does not exist"):
        list(iter_samples(tmp_path / "nope.jsonl"))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(MixError, match="unknown file type"):
        list(iter_samples(tmp_path / "x.csv"))


def test_parquet_and_hf_dataset_and_folder(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": f"p{i}", "response": f"r{i}", "source": "s"} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    assert [s.prompt for b in iter_samples(tmp_path / "a.parquet", batch_size=2) for s in b] == [f"p{i}" for i in range(5)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    assert sum(len(b) for b in iter_samples(tmp_path / "ds")) == 5
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), folder / "2.parquet")
    assert sum(len(b) for b in iter_samples(folder)) == 10


def test_corrupt_parquet(tmp_path):
    p = tmp_path / "c.parquet"
    p.write_bytes(b"not parquet")
    with pytest.raises(MixError, match="cannot read .*as Parquet"):
        list(iter_samples(p))


def test_anthropic_content_blocks_are_kept():
    row = {"messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me compute."},
                                          {"type": "tool_use", "id": "t1", "name": "calc", "input": {"e": "2+2"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "4"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "It is 4."}]}]}
    s = to_sample(row, "x", 0)
    assert '"type": "tool_use"' in s.prompt and '"name": "calc"' in s.prompt  # the call is not dropped
    assert "<|tool|>" in s.prompt and '"tool_result"' in s.prompt and "\n4" in s.prompt  # the result is a tool turn
    assert s.response == "It is 4."
