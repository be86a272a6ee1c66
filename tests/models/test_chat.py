"""Prompts through the chat template (decode, bench, generate agree), the drafter's recorded prompting and the
automatic mask token, on a tiny random target saved with a real BPE tokenizer and a Gemma-style template."""

from __future__ import annotations

import json

import pytest
import torch

from flashdraft.bench.decode_bench import BenchError, load_prompts, markdown_table, summarize
from flashdraft.generate.convo import Renderer
from flashdraft.generate.sources import Sample
from flashdraft.models.chat import ChatError, ChatSettings, Prompt, prompting_mismatch, prompting_of, user_turn_signature
from flashdraft.models.target import TargetError, load_target
from tests.generate.conftest import build_tiny_model, write_jsonl


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory):
    return load_target(str(build_tiny_model(tmp_path_factory.mktemp("chat"), chat_template=True)))


@pytest.fixture(scope="module")
def base_target(tmp_path_factory):
    return load_target(str(build_tiny_model(tmp_path_factory.mktemp("base"))))


def hf_ids(tok, messages):
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_template_mode_is_what_the_tokenizer_renders(chat_target):
    tok = chat_target.tokenizer
    q = "Explain why the sky is blue."
    auto = ChatSettings().encode(chat_target, q)
    assert auto == hf_ids(tok, [{"role": "user", "content": q}])
    assert tok.decode(auto).endswith("<start_of_turn>model\n")
    assert ChatSettings("never").encode(chat_target, q) == chat_target.encode(q)  # today's raw behaviour
    with_system = ChatSettings(system="Be brief.").encode(chat_target, q)
    assert with_system == hf_ids(tok, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": q}])
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": q}]
    assert ChatSettings().encode(chat_target, msgs) == hf_ids(tok, msgs)
    assert "chat template" in ChatSettings().describe(tok) and "never" in ChatSettings("never").describe(tok)


def test_generate_renders_the_same_prompt(chat_target):
    q = "def add(a, b):"
    r = Renderer(chat_target.tokenizer, use_template=True)
    conv = r.start(Sample(source="s", id="0", messages=[{"role": "user", "content": q}]))
    assert r.next_prompt(conv) == ChatSettings().encode(chat_target, q)


def test_a_base_model_continues_raw_text_and_says_so(base_target):
    tok = base_target.tokenizer
    assert ChatSettings().encode(base_target, "hello") == base_target.encode("hello")
    assert "no chat template" in ChatSettings().describe(tok)
    notes = ChatSettings(thinking=True, system="x").notes(tok)
    assert any("--thinking" in n for n in notes) and any("--system" in n for n in notes)
    with pytest.raises(ChatError, match="auto"):
        ChatSettings("sometimes")


def test_prompting_recorded_from_the_sequences(chat_target, base_target):
    tok = chat_target.tokenizer
    assert len(user_turn_signature(tok)) == 2 and user_turn_signature(base_target.tokenizer) == []
    templ = [ChatSettings().encode(chat_target, f"question {i}") + [5, 6] for i in range(3)]
    raw = [chat_target.encode(f"question {i}") + [5, 6] for i in range(3)]
    assert prompting_of(templ, tok)["chat_template"] is True
    assert prompting_of(raw, tok) == {"chat_template": False, "template_share": 0.0, "thinking_share": None}

    class Cfg:
        prompting = prompting_of(templ, tok)

    assert prompting_mismatch(Cfg, ChatSettings(), tok) is None
    assert "--chat-template auto" in prompting_mismatch(Cfg, ChatSettings("never"), tok)

    class Drafter:
        cfg = Cfg

    assert ChatSettings().notes(tok, [Drafter]) == []
    assert any("--chat-template auto" in n for n in ChatSettings("never").notes(tok, [Drafter]))


def test_mask_token_chosen_from_spare_special_tokens(tmp_path):
    target = load_target(str(build_tiny_model(tmp_path / "m", chat_template=True)))
    with pytest.raises(TargetError, match="mask_token_id"):  # pad, bos, eos and the template's markers: none spare
        target.find_mask_token_id()
    tok, model = target.tokenizer, target.model
    tok.add_special_tokens({"additional_special_tokens": ["<repo>", "<file>"]})
    model.resize_token_embeddings(len(tok))
    rows = model.get_input_embeddings().weight
    repo, file = tok.convert_tokens_to_ids(["<repo>", "<file>"])
    with torch.no_grad():
        rows[repo].fill_(1.0)
        rows[file].fill_(1e-3)  # barely trained: the rarely used one
    assert target.find_mask_token_id() == file
    tok.add_special_tokens({"additional_special_tokens": ["<repo>", "<file>", "<reserved_3>"]})
    model.resize_token_embeddings(len(tok))
    assert target.find_mask_token_id() == tok.convert_tokens_to_ids("<reserved_3>")


def test_prompt_files_with_messages_or_prompt(tmp_path):
    p = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "raw"}, {"messages": [{"role": "user", "content": "hi"}]}])
    name, prompts = load_prompts(str(p))
    assert name == "p" and prompts[0] == Prompt(text="raw") and prompts[1].as_messages() == [{"role": "user", "content": "hi"}]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"messages": "hi"}])
    with pytest.raises(BenchError, match="messages"):
        load_prompts(str(bad))
    _, named = load_prompts("code-test", 2)
    assert named[0].text.startswith(("def", "from", "import")) or "def " in named[0].text
    assert "```python" in named[0].as_messages()[0]["content"]  # a chat user asks for the function to complete
    _, math = load_prompts("math-test", 1)
    assert math[0].text.startswith("Question:") and not math[0].as_messages()[0]["content"].startswith("Question:")


def test_bench_table_says_n_a_for_one_token_outputs():
    rec = dict(taus=[], rounds_all=0, runs=1, stage_seconds={s: 0.0 for s in ("prefill", "draft", "tree_build", "verify",
                                                                            "commit")},
               tpot=float("nan"), tokens_per_second=float("nan"), new_tokens=1)
    s = summarize([rec], 7)
    assert s["tau_mean"] != s["tau_mean"]  # nan, never 0
    s["speedup"] = float("nan")
    table = markdown_table({"target": "t", "prompting": "raw", "chain_control": "c", "sets": {"x@T=0": {"ar": s}}})
    assert "| n/a |" in table and "no verify round ran" in table and "nan" not in table
    json.dumps(s)  # still serialisable


def test_training_eval_prompts_follow_the_training_rendering(chat_target, tmp_path):
    from flashdraft.train.evaluate import load_eval_prompts

    p = write_jsonl(tmp_path / "eval.jsonl", [{"messages": [{"role": "user", "content": "hi there"},
                                                           {"role": "assistant", "content": "hello"}]},
                                              {"prompt": "def f():"}, {"prompt_ids": [1, 2, 3]}])
    templ = load_eval_prompts(p, chat_target, 3, ChatSettings())
    assert templ[0] == ChatSettings().encode(chat_target, [{"role": "user", "content": "hi there"}])
    assert templ[1] == ChatSettings().encode(chat_target, "def f():") and templ[2] == [1, 2, 3]
    raw = load_eval_prompts(p, chat_target, 2)
    assert raw == [chat_target.encode("hi there"), chat_target.encode("def f():")]
