"""Cost of one target forward that verifies n tokens on top of a warm KV cache.

The curve t_verify(n) is what speculative speedup is modelled from: speculation pays while verifying
n tokens costs far less than n single-token forwards. Prints the median milliseconds (after warm-up)
of the target body alone and body + LM head over all n rows, for a chain (causal) and a tree mask.

    python experiments/verify_cost.py                      # Gemma-3-270M, 256-token cache, n = 1 16 32 64 128
    python experiments/verify_cost.py --dtype bfloat16 --repeats 15
"""

from __future__ import annotations

import argparse

import torch

from flashdraft.timing import median_ms
from flashdraft.decode.tree import best_first_tree, chain_tree
from flashdraft.models.forward import cache_length, compact_cache, lm_logits, new_cache, target_forward
from flashdraft.models.target import load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="gemma-3-270m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 32, 64, 128])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    target = load_target(args.target, dtype=args.dtype)
    g = torch.Generator().manual_seed(0)
    cache = new_cache()
    ctx = torch.randint(0, target.vocab_size, (args.context,), generator=g)
    target_forward(target, cache, ctx, torch.arange(args.context), torch.ones(args.context, args.context, dtype=torch.bool).tril())
    assert cache_length(cache) == args.context

    print(f"target={args.target} dtype={args.dtype} cache={args.context} threads={args.threads} "
          f"median of {args.repeats} (warm-up {args.warmup})")
    print(f"{'n':>5} {'chain body ms':>14} {'chain +head ms':>15} {'tree body ms':>13} {'ms/token (chain+head)':>22}")
    base = None
    for n in args.sizes:
        ids = torch.randint(0, target.vocab_size, (n,), generator=g)
        chain = chain_tree(int(ids[0]), ids[1:].tolist())
        lp = torch.log_softmax(torch.randn(15, target.vocab_size, generator=g), -1)
        tree = best_first_tree(int(ids[0]), lp, n - 1) if n > 1 else chain

        def verify(tr, head: bool):
            pos = args.context + torch.tensor(tr.depths)
            hidden, _ = target_forward(target, cache, torch.tensor(tr.tokens), pos, tr.visibility())
            if head:
                lm_logits(target, hidden)
            compact_cache(cache, args.context, torch.arange(0))  # back to the warm context

        body = median_ms(lambda: verify(chain, False), args.repeats, args.warmup)
        full = median_ms(lambda: verify(chain, True), args.repeats, args.warmup)
        tbody = median_ms(lambda: verify(tree, False), args.repeats, args.warmup)
        base = base or full
        print(f"{n:>5} {body:>14.1f} {full:>15.1f} {tbody:>13.1f} {full / n:>22.2f}   ({full / base:.2f}x the 1-token forward)")


if __name__ == "__main__":
    main()
