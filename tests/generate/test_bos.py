"""Plain-continuation prompts start with BOS even when the tokenizer does not add it (GGUF conversions)."""

from __future__ import annotations

from flashdraft.generate.convo import Renderer
from flashdraft.generate.sources import Sample
from tests.train.test_data_cli import word_tokenizer


def test_plain_prompt_gets_bos_once():
    tok = word_tokenizer()  # a WordLevel tokenizer without a post-processor: adds no BOS
    assert tok("hello world")["input_ids"] == [3, 4]
    r = Renderer(tok, use_template=False, eos_ids=[1])
    conv = r.start(Sample("s", "0", [{"role": "user", "content": "hello world"}]))
    assert r.next_prompt(conv) == [2, 3, 4]  # <bos> hello world
    conv2 = r.start(Sample("s", "1", [{"role": "user", "content": "<bos> hello"}]))
    assert r.next_prompt(conv2) == [2, 3]  # never twice
