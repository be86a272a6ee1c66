"""Records -> tokens + loss mask (plain concatenation, chat template, Parquet), the data stream, the CLI."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from typer.testing import CliRunner

import flashdraft.models.target as target_mod
from flashdraft.train.cli import train
from flashdraft.train.data import DataStream, Example, load_examples, tokenize_record
from flashdraft.train.objective import TrainError
from tests.tiny import tiny_target

from .test_loop import write_data

WORDS = ["<pad>", "<eos>", "<bos>", "hello", "world", "how", "are", "you", "fine", "<u>", "<a>", "<end>"]


def word_tokenizer(template: str | None = None):
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    if template:
        fast.chat_template = template
    return fast


CHAT = "{% for m in messages %}{{ '<u> ' if m.role == 'user' else '<a> ' }}{{ m.content }}{% if m.role == 'assistant' %} <end>{% endif %} {% endfor %}{% if add_generation_prompt %}<a> {% endif %}"


def test_plain_concatenation_for_a_base_model():
    tok = word_tokenizer()
    ids, mask = tokenize_record({"prompt": "hello world", "response": "fine"}, tok, eos_id=1)
    assert ids == [3, 4, 8, 1] and mask == [0, 0, 1, 1]
    with pytest.raises(TrainError, match="chat template"):
        tokenize_record({"messages": [{"role": "user", "content": "hi"}]}, tok, eos_id=1)


def test_chat_template_masks_assistant_turns_only():
    tok = word_tokenizer(CHAT)
    msgs = [{"role": "user", "content": "how are you"}, {"role": "assistant", "content": "fine"},
            {"role": "user", "content": "hello"}, {"role": "assistant", "content": "hello world"}]
    ids, mask = tokenize_record({"messages": msgs}, tok, eos_id=1)
    words = [WORDS[i] for i in ids]
    assert words == ["<u>", "how", "are", "you", "<a>", "fine", "<end>", "<u>", "hello", "<a>", "hello", "world", "<end>"]
    assert [w for w, m in zip(words, mask) if m] == ["fine", "<end>", "hello", "world", "<end>"]
    ids2, mask2 = tokenize_record({"prompt": "how are you", "response": "fine"}, tok, eos_id=1)
    assert ids2 == ids[:7] and mask2 == mask[:7]


def test_parquet_token_records_and_skips(tmp_path):
    t = tiny_target("qwen3")
    rows = [{"token_ids": list(range(1, 11)), "loss_mask": [0] * 4 + [1] * 6},
            {"token_ids": [1, 2, 3], "loss_mask": [0, 1, 1]},  # shorter than a block
            {"token_ids": list(range(1, 11)), "loss_mask": [1, 0] * 5}]  # no two consecutive supervised tokens
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    ex, stats = load_examples([tmp_path / "d.parquet"], t, max_len=8, block_size=4)
    assert len(ex) == 1 and ex[0].token_ids == list(range(1, 9)) and ex[0].loss_mask == [0] * 4 + [1] * 4
    assert (stats.skipped_short, stats.skipped_unsupervised, stats.truncated) == (1, 1, 2)
    with pytest.raises(TrainError, match="no usable"):
        load_examples([tmp_path / "d.parquet"], t, max_len=8, block_size=9)


def test_stream_position_restores_and_packing_isolates_documents():
    ex = [Example(list(range(i, i + 5 + i)), [1] * (5 + i), i) for i in range(5)]
    a = DataStream(ex, batch_size=2, seed=3)
    first = [a.next_batch() for _ in range(4)]
    b = DataStream(ex, batch_size=2, seed=3)
    b.next_batch(); b.next_batch()
    c = DataStream(ex, batch_size=2, seed=3)
    c.load_state_dict(b.state_dict())
    for want in first[2:]:
        got = c.next_batch()
        assert got.input_ids.equal(want.input_ids) and got.row_seeds == want.row_seeds
    p = DataStream(ex, batch_size=1, seed=3, pack=True, max_len=20).next_batch()
    assert p.doc_ids.max() >= 1 and p.input_ids.shape[1] <= 20
    for d in range(int(p.doc_ids.max()) + 1):  # positions restart in each packed document
        assert p.positions[p.doc_ids == d][0] == 0


def test_cli_trains_exports_and_reports_errors(tmp_path, monkeypatch):
    data = write_data(tmp_path / "d.jsonl", n=3)
    monkeypatch.setattr(target_mod, "load_target", lambda spec, **kw: tiny_target("qwen3"))
    app = typer.Typer()
    app.command()(train)
    (tmp_path / "c.yaml").write_text("num_layers: 1\nblock_size: 4\nmax_len: 64\nprogress: false\n")
    args = ["--config", str(tmp_path / "c.yaml"), "--data", str(data), "--out-dir", str(tmp_path / "run"),
            "--max-steps", "2", "--set", "mask_token_id=95", "--set", "target_layer_ids=[1, 3]", "--set", "save_every=1"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["step"] == 2 and (tmp_path / "run" / "drafter" / "config.json").is_file()
    bad = CliRunner().invoke(app, [*args, "--set", "gamma=-1"])
    assert bad.exit_code == 2 and "gamma" in bad.output
    bad2 = CliRunner().invoke(app, [*args, "--set", "nonsense=1"])
    assert bad2.exit_code != 0 and "no such train config field" in bad2.output


def test_generate_output_folder_is_training_data(tmp_path):
    """`flashdraft generate` writes part-*.parquet records with token_ids + loss_mask: train reads the folder."""
    from flashdraft.generate.output import OutputWriter
    from flashdraft.train.data import load_examples
    from tests.tiny import tiny_target

    w = OutputWriter(tmp_path / "regen", flush_every=2)
    for i in range(3):
        w.add({"source": "s", "id": f"s:{i}", "messages": [], "response": "", "token_ids": list(range(1, 21)),
               "loss_mask": [0] * 8 + [1] * 12})
    w.flush()
    examples, stats = load_examples([tmp_path / "regen"], tiny_target("qwen3"), max_len=64, block_size=4)
    assert stats.records == 3 and len(examples) == 3 and stats.supervised_tokens == 36
