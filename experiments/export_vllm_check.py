"""A drafter folder exported ``--to vllm`` and served by the installed vLLM build on real prompts: vLLM's
acceptance next to flashdraft's own chain decoder's, and both outputs against plain greedy.

The serve tests (``tests/export/test_vllm_serve.py``, ``test_vllm_eagle3_serve.py``) prove the format on
three short prompts; this runs any drafter (the shipped assets included) on the first ``--limit``
HumanEval prompts, with the num_speculative_tokens the export's manifest names (the drafter's own: block
size - 1 for DFlash, max_depth for EAGLE-3). One subprocess (``tests/export/vllm_driver.py``) runs plain
greedy and then speculative greedy, eager, Transformers model implementation (which gives Gemma-3 the
auxiliary hidden states EAGLE-3 needs), in ``--dtype`` (bf16 as served; fp32 takes bf16 near-ties between
vLLM's kernels and HF's out of the comparison). flashdraft's chain runs on the same target in the same dtype,
with the draft slots vLLM fills: a DFlash drafter trained with block hints gets them from flashdraft's vLLM plugin
(``FLASHDRAFT_VLLM_HINTS=0`` turns it off, and both engines then fill MASK).

    python experiments/export_vllm_check.py assets/gemma-3-270m-eagle3 --limit 8 --max-tokens 48
    python experiments/export_vllm_check.py assets/gemma-3-270m-dflash --prompts math-test --limit 16 --max-tokens 128
    python experiments/export_vllm_check.py DRAFTER --target smollm2-135m-instruct --prompts chat-test \
        --model-impl vllm --dtype float32     # a chat target: prompts rendered with its template, vLLM's own Llama

``--target`` names the embedded target the drafter was trained on (or an HF folder); prompts are rendered the way
``bench decode`` renders them (``--chat-template auto``: the target's template when it has one). ``--model-impl
vllm`` runs vLLM's native model class instead of the Transformers backend.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

from flashdraft.bench.decode_bench import decode_methods, load_prompts
from flashdraft.decode import DECODERS, build_decoder
from flashdraft.export.formats import MANIFEST, export_drafter
from flashdraft.export.vllm_plugin import wants_hints
from flashdraft.models.drafter import load_drafter
from flashdraft.models.chat import ChatSettings
from flashdraft.models.target import EMBEDDED_TARGETS, embedded_target_dir, load_target

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests.export
from tests.export.vllm_driver import launch  # noqa: E402


def same_prefix(a: list[int], b: list[int]) -> bool:
    """Equal over the shorter one's length (flashdraft stops at the end-of-turn token; the driver ignores it)."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("drafter", help="a flashdraft drafter folder (DFlash or EAGLE-3)")
    ap.add_argument("--prompts", default="humaneval", help="a prompt set as bench decode reads it (humaneval, code-test, "
                    "math-test, chat-test, multilingual-test, a JSONL file)")
    ap.add_argument("--limit", type=int, default=8, help="the first N prompts of the set, as bench decode reads them")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="the target's dtype in both engines")
    ap.add_argument("--target", default="gemma-3-270m", help="the drafter's target: an embedded name or an HF folder")
    ap.add_argument("--chat-template", choices=("auto", "never"), default="auto",
                    help="auto: prompts rendered with the target's chat template when it has one")
    ap.add_argument("--seqs", type=int, default=1, help="vLLM's max_num_seqs: requests decoded in one batch")
    ap.add_argument("--model-impl", choices=("transformers", "vllm", "auto"), default="transformers",
                    help="vLLM's model implementation for the target (vllm: its native class)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target = load_target(a.target, dtype=a.dtype)
    chat = ChatSettings(mode=a.chat_template)
    prompts = [chat.encode(target, p) for p in load_prompts(a.prompts, a.limit)[1]]
    target_dir = embedded_target_dir(a.target) if a.target in EMBEDDED_TARGETS else Path(a.target)
    print(f"prompts: {chat.describe(target.tokenizer)}")
    with tempfile.TemporaryDirectory() as tmp:
        out = export_drafter(a.drafter, "vllm", Path(tmp) / "drafter", target, str(target_dir),
                             serve_dtype=a.dtype).out
        spec = json.loads((out / MANIFEST).read_text())["speculative_config"]
        k = spec["num_speculative_tokens"]
        served_hints = json.loads((out / "config.json").read_text()).get("block_hints")  # kept for the plugin
        try:
            res = launch(out, prompts, a.max_tokens, tmp, a.model_impl, spec["method"], k, a.dtype, a.seqs,
                         threads=a.threads, timeout=None, target_dir=target_dir)
        except RuntimeError as e:
            sys.exit(str(e))

    plain, served, m = res["plain"]["outputs"], res["spec"]["outputs"], res["spec"]["metrics"]
    drafter = load_drafter(a.drafter, target)
    chain = decode_methods(drafter)[0]
    plugin = wants_hints(SimpleNamespace(block_hints=served_hints))  # as flashdraft's vLLM plugin decides
    hints = {"hints": "lookup" if plugin else "none"} if "hints" in DECODERS[chain].OPTIONS else {}
    dec = build_decoder(chain, target, drafter, budget=k, **hints)
    ours, rounds, accepted = [], 0, 0
    for p in prompts:
        g = dec.generate(p, a.max_tokens)
        ours.append(g.tokens)
        rounds += len(g.stats.taus)
        accepted += sum(g.stats.accepted)  # as vLLM counts: the last round's drafts before the output is cut
    theirs_rate = m["num_accepted_tokens"] / m["num_draft_tokens"]
    ours_rate = accepted / (rounds * k)
    print(f"{a.drafter}: vLLM method {spec['method']!r}, num_speculative_tokens {k}, {len(prompts)} {a.prompts} "
          f"prompts x {a.max_tokens} tokens, {a.dtype} target, vLLM model_impl {a.model_impl}, max_num_seqs {a.seqs}; "
          "flashdraft's chain "
          f"{chain} {hints or ''}")
    print("| engine | acceptance rate (accepted / drafted) | tau (1 + accepted per round) | rounds | output == vLLM plain |")
    print("|---|---|---|---|---|")
    print(f"| vLLM | {theirs_rate:.3f} | {1 + m['num_accepted_tokens'] / m['num_drafts']:.2f} | {m['num_drafts']} | "
          f"{sum(same_prefix(s, q) for s, q in zip(served, plain))}/{len(prompts)} |")
    print(f"| flashdraft | {ours_rate:.3f} | {1 + accepted / rounds:.2f} | {rounds} | "
          f"{sum(same_prefix(o, q) for o, q in zip(ours, plain))}/{len(prompts)} |")
    print(f"relative gap in acceptance rate: {abs(theirs_rate - ours_rate) / ours_rate:.1%}")


if __name__ == "__main__":
    main()
