"""Fixtures for generate tests: a tiny random causal LM saved with a small real BPE tokenizer."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def build_tiny_model(folder: Path, chat_template: bool = False, vocab: int = 384, seed: int = 0) -> Path:
    """A 2-layer random Qwen3 + a byte-level BPE trained on stdlib text, saved as an HF folder."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast, Qwen3Config

    specials = ["<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    text = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text()
    tk.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    from tokenizers.processors import TemplateProcessing

    tk.post_processor = TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", tk.token_to_id("<bos>"))])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    if chat_template:
        tok.chat_template = CHAT_TEMPLATE
    eos = [tok.eos_token_id] + ([tk.token_to_id("<end_of_turn>")] if chat_template else [])
    cfg = Qwen3Config(vocab_size=tk.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                      bos_token_id=tok.bos_token_id, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config = GenerationConfig(eos_token_id=eos, bos_token_id=tok.bos_token_id,
                                               pad_token_id=tok.pad_token_id)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-base"))


@pytest.fixture(scope="session")
def tiny_chat_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-chat"), chat_template=True)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path
