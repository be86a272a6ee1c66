"""Tree-verify cost on hybrid targets (exact recurrent handling) next to a dense target of the same width.

For each tree budget B (a DDTree tree of B drafted nodes + the root, depth <= 15, from random
marginals) the target body verifies the tree on a warm cache of ``--context`` tokens. Three figures:

- ``dense``: a pure-attention Qwen3 of the same width, heads and depth (tree mask only);
- ``hybrid exact``: the hybrid through flashdraft's exact path (each node's recurrent state from its
  parent's: depth + 1 sequential batched steps per recurrent layer, one state per node kept);
- ``hybrid in-order``: the same hybrid feeding the B + 1 tokens through its recurrent layers in order
  with the model's own chunked scan (what a naive verifier pays; NOT lossless on a tree).

Medians of ``--repeats`` runs after warm-up, one run of this script; ratios come from that run.

    python experiments/hybrid_verify.py                          # tiny width (32), budgets 8 32 128
    python experiments/hybrid_verify.py --hidden 256 --layers 8  # a wider random model
"""

from __future__ import annotations

import argparse
import warnings

import torch
from transformers import AutoModelForCausalLM, NemotronHConfig, Qwen3_5TextConfig, Qwen3Config

from flashdraft.bench.profile import median_recurrent_ms
from flashdraft.timing import median_ms
from flashdraft.decode.tree import best_first_tree
from flashdraft.models.forward import compact_cache, new_cache, target_forward
from flashdraft.models.target import wrap_model


def configs(hidden: int, layers: int, vocab: int) -> dict:
    heads, hd = max(hidden // 64, 4), hidden // max(hidden // 64, 4)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3, num_attention_heads=heads,
                  num_key_value_heads=max(heads // 2, 1), head_dim=hd, max_position_embeddings=4096,
                  tie_word_embeddings=False)
    # Qwen3.5 / Nemotron-H layouts: 3 recurrent layers per attention layer
    pattern = ["linear_attention" if i % 4 != 3 else "full_attention" for i in range(layers)]
    return {
        "dense qwen3": Qwen3Config(num_hidden_layers=layers, **common),
        "qwen3_5 (gated DeltaNet)": Qwen3_5TextConfig(
            num_hidden_layers=layers, layer_types=pattern, linear_conv_kernel_dim=4, linear_key_head_dim=hd,
            linear_value_head_dim=hd, linear_num_key_heads=max(heads // 2, 1), linear_num_value_heads=heads, **common),
        "nemotron_h (Mamba-2)": NemotronHConfig(
            layers_block_type=pattern, ssm_state_size=max(hd // 2, 8), mamba_num_heads=heads, mamba_head_dim=hd,
            n_groups=max(heads // 4, 1), conv_kernel=4, chunk_size=64, **common),
    }


@torch.no_grad()
def measure(target, budgets, context: int, repeats: int, warmup: int, sharpness: float, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    V = target.vocab_size
    cache = new_cache(target)
    ctx = torch.randint(0, V, (context,), generator=g)
    target_forward(target, cache, ctx, torch.arange(context), torch.ones(context, context, dtype=torch.bool).tril())
    rec = getattr(cache, "recurrent_ids", [])
    snap = {i: (cache.layers[i].conv_states[0].clone(), cache.layers[i].recurrent_states[0].clone()) for i in rec}

    def restore():
        compact_cache(cache, context, torch.arange(0))
        for i, (c, r) in snap.items():
            cache.layers[i].conv_states[0], cache.layers[i].recurrent_states[0] = c.clone(), r.clone()

    out = {}
    for B in budgets:
        logits = torch.randn(15, V, generator=g)
        logits[torch.arange(15), torch.randint(0, V, (15,), generator=g)] += sharpness  # a confident drafter's spine
        lp = torch.log_softmax(logits, -1)
        tree = best_first_tree(int(ctx[-1]), lp, B)
        ids, pos, vis = torch.tensor(tree.tokens), context + torch.tensor(tree.depths), tree.visibility()
        n = len(tree)

        def exact():
            target_forward(target, cache, ids, pos, vis, tree_parents=tree.parents)
            restore()

        row = {"nodes": n, "depth": max(tree.depths), "exact_ms": median_ms(exact, repeats, warmup)}
        if rec:
            seq_pos = context + torch.arange(n)
            causal = torch.ones(n, n, dtype=torch.bool).tril()

            def in_order():
                target_forward(target, cache, ids, seq_pos, causal)  # the model's chunked scan, committed
                restore()

            row["in_order_ms"] = median_ms(in_order, repeats, warmup)
            row["recurrent_ms"] = median_recurrent_ms(target, exact, repeats, warmup=0)  # exact() ran warm above
        out[B] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sharpness", type=float, default=9.0, help="logit boost of one token per depth (tree depth)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")

    results = {}
    for name, cfg in configs(args.hidden, args.layers, args.vocab).items():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
        results[name] = measure(wrap_model(model, name=name), args.budgets, args.context, args.repeats, args.warmup,
                                args.sharpness)

    print(f"hidden={args.hidden} layers={args.layers} (3 recurrent : 1 attention) vocab={args.vocab} "
          f"cache={args.context} threads={args.threads} sharpness={args.sharpness}; "
          f"median of {args.repeats} (warm-up {args.warmup}), ms")
    dense = results["dense qwen3"]
    print(f"{'target':<26} {'B':>4} {'nodes':>5} {'depth':>5} {'verify ms':>10} {'in-order ms':>12} "
          f"{'recurrent ms':>13} {'x dense':>8} {'x in-order':>11}")
    for name, rows in results.items():
        for B, r in rows.items():
            io, rec = r.get("in_order_ms"), r.get("recurrent_ms")
            io_s, rec_s = (f"{io:.2f}", f"{rec:.2f}") if io else ("-", "-")
            ratio_io = f"{r['exact_ms'] / io:.2f}" if io else "-"
            print(f"{name:<26} {B:>4} {r['nodes']:>5} {r['depth']:>5} {r['exact_ms']:>10.2f} {io_s:>12} {rec_s:>13} "
                  f"{r['exact_ms'] / dense[B]['exact_ms']:>8.2f} {ratio_io:>11}")
    for name, rows in results.items():
        if "in_order_ms" in next(iter(rows.values())):
            extra = ", ".join(f"B={B}: {r['exact_ms'] - r['in_order_ms']:+.2f} ms ({r['exact_ms'] / r['in_order_ms']:.2f}x "
                              f"in-order, {r['exact_ms'] / dense[B]['exact_ms']:.2f}x dense)" for B, r in rows.items())
            print(f"exact recurrent handling, {name}: {extra}")


if __name__ == "__main__":
    main()
