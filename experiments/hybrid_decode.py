"""``bench decode`` on tiny hybrid targets next to a dense target of the same width.

Random targets of the same width and depth (a dense Qwen3, a Qwen3.5 gated-DeltaNet hybrid and a
Nemotron-H Mamba-2 hybrid, 3 recurrent layers per attention layer) run the decode benchmark sweep
(:func:`flashdraft.bench.decode_bench.run_decode_bench`) with the same drafter: it proposes the
target's own greedy continuation (computed once per prompt with the AR decoder), wrong at every 4th
position with the right token ranked second, so trees recover what a chain loses. Prints per budget:
tau, verify ms per round (the stage timer of the decoder), speedup vs AR, and whether every output
equals AR's; then verify ms of each hybrid relative to the dense target.

    python experiments/hybrid_decode.py                        # hidden 32, budgets 8 32 128
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from flashdraft.bench.decode_bench import run_decode_bench
from flashdraft.decode import build_decoder
from flashdraft.models.target import wrap_model

sys.path.insert(0, str(Path(__file__).parent))
from hybrid_verify import configs  # noqa: E402


class LookupDrafter:
    """Proposes a known continuation of each prompt (deliberately wrong at every ``wrong_every``-th
    draft, the right token second); needs no features."""

    target_layer_ids: list[int] = []

    def __init__(self, vocab: int, references: dict[tuple, list[int]], block_size: int = 16, wrong_every: int = 4):
        self.vocab, self.refs, self.block_size, self.wrong_every = vocab, references, block_size, wrong_every

    @property
    def max_depth(self) -> int:
        return self.block_size - 1

    def reset(self) -> None:
        pass

    def propose(self, tokens: torch.Tensor, new_features) -> torch.Tensor:
        toks = tokens.tolist()
        logits = torch.zeros(self.block_size - 1, self.vocab)
        for prompt, ref in self.refs.items():
            if tuple(toks[: len(prompt)]) == prompt:
                full = list(prompt) + ref
                for k in range(self.block_size - 1):
                    j = len(toks) + k
                    true = full[j] if j < len(full) else 0
                    if (j - len(prompt)) % self.wrong_every == self.wrong_every - 1:
                        logits[k, (true + 1) % self.vocab], logits[k, true] = 20.0, 19.0
                    else:
                        logits[k, true] = 20.0
                return logits
        return logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, args.vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.prompts)]
    table = {}
    for name, cfg in configs(args.hidden, args.layers, args.vocab).items():
        torch.manual_seed(0)
        target = wrap_model(AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32), name=name)
        ar = build_decoder("ar", target)
        refs = {tuple(p): ar.generate(p, args.max_new_tokens + 16).tokens for p in prompts}
        drafter = LookupDrafter(args.vocab, refs)
        with tempfile.TemporaryDirectory() as tmp:
            res = run_decode_bench(target, {"lookup": drafter}, {"rand": prompts}, budgets=args.budgets,
                                   temperatures=[0.0], max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                                   out_dir=Path(tmp), log=lambda m: None)
        table[name] = res["sets"]["rand@T=0"]

    print(f"hidden={args.hidden} layers={args.layers} vocab={args.vocab} prompts={args.prompts}x{args.prompt_len} "
          f"new={args.max_new_tokens} repeats={args.repeats} threads={args.threads}; T=0")
    print(f"{'target':<26} {'variant':<20} {'tau':>5} {'verify ms/round':>16} {'speedup':>8} {'=AR':>5}")
    for name, rows in table.items():
        for v in ["ar", "lookup/dflash"] + [f"lookup/ddtree@{b}" for b in args.budgets]:
            s = rows[v]
            print(f"{name:<26} {v:<20} {s['tau_mean']:>5.2f} {s['stage_ms_per_round']['verify']:>16.2f} "
                  f"{s['speedup']:>8.2f} {s['identical_to_ar']:>3}/{s['prompts']}")
    dense = table["dense qwen3"]
    for name, rows in table.items():
        if name == "dense qwen3":
            continue
        def verify_ms(rows, b):
            return rows[f"lookup/ddtree@{b}"]["stage_ms_per_round"]["verify"]

        ratios = ", ".join(f"B={b}: {verify_ms(rows, b) / verify_ms(dense, b):.2f}x" for b in args.budgets)
        print(f"verify ms per round, {name} / dense: {ratios}")


if __name__ == "__main__":
    main()
