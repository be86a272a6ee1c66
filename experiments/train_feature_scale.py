"""What the fc input scale changes on a real target, at initialisation (no training needed).

For a few training sequences of ``--data`` it prints the target's feature statistics (per layer: the
top channel's share of the energy) and, for a fresh drafter fed raw features (feature_norm none)
and the per-channel / per-layer scaled ones: the share of fc's output that the largest input
channel makes, and the mean pairwise cosine of the context vectors (after hidden_norm) of
different positions (near 1: every position looks the same to the drafter).

    python experiments/train_feature_scale.py --data runs/d300/generated --sequences 4
"""

from __future__ import annotations

import argparse
import json

import torch

from flashdraft.models.dflash import DFlashDrafter
from flashdraft.models.target import load_target
from flashdraft.train.data import collate, load_examples
from flashdraft.train.diagnostics import channel_rms, feature_scale, feature_stats, format_feature_stats, sample_mask
from flashdraft.models.forward import target_pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--target", default="gemma-3-270m")
    ap.add_argument("--layers", default="1,8,15")
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--max-len", type=int, default=320)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target = load_target(a.target)
    layers = [int(x) for x in a.layers.split(",")]
    examples, _ = load_examples([a.data], target, a.max_len, 8)
    rows = [[e] for e in examples[: a.sequences]]
    batch = collate(rows, [0] * len(rows))
    feats, _ = target_pass(target, batch, layers, False)
    x = feats[sample_mask(batch.positions, batch.doc_ids)].float()  # [N, K * H]
    rms = channel_rms(x)
    stats = feature_stats(rms, layers)
    print(format_feature_stats(stats))
    out = {"feature_stats": stats, "positions": int(x.shape[0]), "modes": {}}
    drafter = DFlashDrafter.for_target(target, num_layers=1, block_size=8, target_layer_ids=layers).float()
    for mode in ("none", "layer", "channel"):
        s = feature_scale(rms, len(layers), mode)
        xs = x * s  # what fc reads
        contrib = (drafter.fc.weight.detach().float()[None] * xs[:, None, :]).pow(2).sum(1).mean(0)  # [K*H] energy per input
        top = int(contrib.argmax())
        with torch.no_grad():
            ctx = drafter.hidden_norm(drafter.fc(xs))  # [N, d]
        c = torch.nn.functional.normalize(ctx, dim=-1)
        sim = c @ c.T
        n = sim.shape[0]
        mean_cos = float((sim.sum() - n) / (n * (n - 1)))
        out["modes"][mode] = {"top_input_channel": [top // target.hidden_size, top % target.hidden_size],
                              "top_input_share_of_fc_output": float(contrib[top].detach() / contrib.sum().detach()),
                              "mean_pairwise_cosine": mean_cos}
        print(f"{mode:>7}: largest fc input (layer index {top // target.hidden_size}, channel {top % target.hidden_size}) "
              f"makes {100 * float(contrib[top] / contrib.sum()):.0f}% of fc's output energy; "
              f"context vectors' mean pairwise cosine {mean_cos:.2f}")
    print(json.dumps(out["modes"]))


if __name__ == "__main__":
    main()
