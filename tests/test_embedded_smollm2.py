"""The embedded chat target, SmolLM2-135M-Instruct (Llama architecture, ChatML template): prompts go through its
template as a served user's do; AR equals HF generate on them, and DFlash and DDTree with a fresh drafter (its mask
token chosen automatically: the vocabulary has none) are token-identical to AR on 4 chat prompts x 64 tokens."""

import pytest
import torch

from flashdraft.decode import build_decoder
from flashdraft.models.chat import ChatSettings
from flashdraft.models.dflash import DFlashDrafter
from tests.lossless import assert_same_tokens

pytestmark = pytest.mark.embedded
NEW = 64
QUESTIONS = ["Explain why the sky is blue.", "Write a Python function that reverses a string.",
             "What is 17 times 23? Think step by step.", "Traduis en français : « Le chat dort sur le canapé. »"]


@pytest.fixture(scope="module")
def references(smollm2_target):
    ar = build_decoder("ar", smollm2_target)
    prompts = [ChatSettings().encode(smollm2_target, q) for q in QUESTIONS]
    return [(p, ar.generate(p, NEW).tokens) for p in prompts]


def test_ar_equals_hf_generate_with_the_template(smollm2_target, references):
    tok = smollm2_target.tokenizer
    for q, (p, ref) in zip(QUESTIONS, references):
        hf = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=True, add_generation_prompt=True)
        assert p == list(hf["input_ids"] if hasattr(hf, "keys") else hf)
        with torch.no_grad():
            out = smollm2_target.model.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False,
                                                pad_token_id=tok.pad_token_id)[0, len(p):].tolist()
        assert_same_tokens(smollm2_target, p, ref, out, "ar/hf-generate/smollm2")
        assert ref[0] != 2 and len(ref) > 8  # an answer, not an ended turn (what raw prompts got)


def test_fresh_drafter_is_lossless_with_an_automatic_mask_token(smollm2_target, references, capsys):
    drafter = DFlashDrafter.for_target(smollm2_target, num_layers=1, block_size=8, seed=0)
    mask = drafter.mask_token_id
    assert "mask token:" in capsys.readouterr().err
    assert mask not in (0, 1, 2) and smollm2_target.tokenizer.convert_ids_to_tokens(mask).startswith("<")
    for method, budget in (("dflash", None), ("ddtree", 16)):
        for p, ref in references:
            res = build_decoder(method, smollm2_target, drafter, budget=budget).generate(p, NEW)
            assert_same_tokens(smollm2_target, p, res.tokens, ref, f"random-{method}/smollm2")


def test_run_answers_a_question_and_never_keeps_raw_text():
    from typer.testing import CliRunner

    from flashdraft.cli import app

    r = CliRunner().invoke(app, ["run", "Explain why the sky is blue.", "--target", "smollm2-135m-instruct",
                                 "--max-new-tokens", "16"])
    assert r.exit_code == 0, r.output
    assert "prompting: the target's chat template" in r.output and "new_tokens=16" in r.output
    raw = CliRunner().invoke(app, ["run", "Explain why the sky is blue.", "--target", "smollm2-135m-instruct",
                                   "--max-new-tokens", "16", "--chat-template", "never"])
    assert raw.exit_code == 0, raw.output
    assert "prompting: raw prompt text (--chat-template never)" in raw.output
