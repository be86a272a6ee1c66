"""Training diagnostics: feature statistics, the feature scale, n-gram baselines and the context ablation.

A drafter can fail silently: trained on features it cannot read, it learns the most frequent tokens
and its loss still goes down. These figures tell a user whether it reads the target:

* :func:`feature_stats` - per target layer, the channel RMS and the share of the energy its top
  channels hold (massive activations: one channel holding most of the energy);
* :func:`feature_scale` - the per-channel (or per-layer) input scale of ``fc`` that equalises them;
* :class:`NgramBaseline` - bigram/trigram chains fitted on the training data, prompt lookup and
  "lookup, else trigram", scored on the same held-out anchors as the drafter;
* :func:`heldout_report` - the drafter's held-out per-slot accuracy, with its context features as
  they are, zeroed, and shuffled across sequences, next to those baselines.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import torch

from flashdraft.decode.ngram import lookup
from flashdraft.train.data import Example, collate
from flashdraft.train.objective import acceptance_metrics

FEATURE_NORMS = ("none", "layer", "channel")
ABLATION_WARN_RATIO = 0.8  # ablated slot-1 accuracy >= 80% of the drafter's: the context barely matters


def sample_mask(doc_positions: torch.Tensor, doc_ids: torch.Tensor) -> torch.Tensor:
    """[b, T] bool: real tokens except each document's first (the attention-sink position)."""
    return (doc_ids >= 0) & (doc_positions > 0)


@torch.no_grad()
def channel_rms(features: torch.Tensor) -> torch.Tensor:
    """features [N, D] -> per-channel RMS [D] (fp32)."""
    f = features.float()
    return f.pow(2).mean(0).sqrt()


@torch.no_grad()
def feature_stats(rms: torch.Tensor, layer_ids: list[int], top: int = 5) -> list[dict]:
    """Channel RMS [K * H] (K = len(layer_ids), from :func:`channel_rms`) -> per layer: RMS of the
    median / largest channel and the share of the energy (sum of squares) of its top-1 and top-``top`` channels."""
    rms = rms.float().view(len(layer_ids), -1)  # [K, H]
    out = []
    for i, layer in enumerate(layer_ids):
        r = rms[i]
        energy = r.pow(2)
        share = energy / energy.sum().clamp(min=1e-30)
        order = share.argsort(descending=True)[:top]
        out.append(dict(
            layer=int(layer), rms_median=float(r.median()), rms_max=float(r.max()),
            top_channels=[int(c) for c in order], top_rms=[round(float(r[c]), 3) for c in order],
            top1_share=float(share[order[0]]), top_share=float(share[order].sum()), top=top,
            overall_rms=float(energy.mean().sqrt()),
        ))
    return out


@torch.no_grad()
def store_channel_rms(store, n: int = 64) -> torch.Tensor:
    """Channel RMS [K * H] of an offline feature cache over its first ``n`` examples (positions > 0)."""
    sq, count = None, 0
    for i in range(min(n, store.n_examples)):
        f, _ = store.get(i)
        f = f[1:].double()  # [n - 1, K * H]: the first position is the attention sink
        sq = f.pow(2).sum(0) if sq is None else sq + f.pow(2).sum(0)
        count += f.shape[0]
    if sq is None:
        raise ValueError(f"feature cache {store.path} holds no examples")
    return (sq / max(count, 1)).sqrt().float()


def format_feature_stats(stats: list[dict]) -> str:
    lines = ["target feature statistics (per layer; position 0 of each sequence excluded):"]
    for s in stats:
        lines.append(
            f"  layer {s['layer']:>3}: channel RMS median {s['rms_median']:.3g}, max {s['rms_max']:.3g}; "
            f"top-1 channel {s['top_channels'][0]} holds {100 * s['top1_share']:.0f}% of the energy, "
            f"top-{s['top']} {100 * s['top_share']:.0f}%"
        )
    worst = max(stats, key=lambda s: s["top1_share"]) if stats else None
    if worst and worst["top1_share"] > 0.2:
        lines.append(f"  massive activations: layer {worst['layer']}'s channel {worst['top_channels'][0]} dominates; "
                     "train with feature_norm 'channel' (default) so fc sees every channel at the same scale")
    return "\n".join(lines)


@torch.no_grad()
def feature_scale(rms: torch.Tensor, n_layers: int, mode: str = "channel", floor: float = 1e-3) -> torch.Tensor:
    """The fc input scale [K * H] from the channel RMS [K * H] of sample features (:func:`channel_rms`).

    channel: 1 / RMS of each channel (every channel at unit RMS); layer: 1 / RMS of each layer's
    block (outliers kept, layers at the same scale); none: ones. RMS values below ``floor`` times the
    layer's median channel RMS are raised to it (a dead channel is not amplified without bound).
    """
    if mode not in FEATURE_NORMS:
        raise ValueError(f"feature_norm {mode!r} is not one of {', '.join(FEATURE_NORMS)}")
    rms = rms.float().view(n_layers, -1)  # [K, H]
    if mode == "none":
        return torch.ones(rms.numel())
    if mode == "layer":
        per_layer = rms.pow(2).mean(-1, keepdim=True).sqrt().clamp(min=1e-12)  # [K, 1]
        return (1.0 / per_layer).expand_as(rms).flatten().clone()
    low = rms.median(-1, keepdim=True).values * floor
    return (1.0 / torch.maximum(rms, low.clamp(min=1e-12))).flatten()


class NgramBaseline:
    """Greedy bigram / trigram chains fitted on the training data's tokens (whole sequences)."""

    def __init__(self, examples: list[Example]):
        bi: dict[int, Counter] = defaultdict(Counter)
        tri: dict[tuple[int, int], Counter] = defaultdict(Counter)
        uni: Counter = Counter()
        for e in examples:
            t = e.token_ids
            uni.update(t)
            for a, b in zip(t, t[1:]):
                bi[a][b] += 1
            for a, b, c in zip(t, t[1:], t[2:]):
                tri[(a, b)][c] += 1
        self.top = uni.most_common(1)[0][0] if uni else 0
        self.bi = {a: c.most_common(1)[0][0] for a, c in bi.items()}
        self.tri = {ab: c.most_common(1)[0][0] for ab, c in tri.items()}

    def chain(self, context: list[int], k: int, order: int = 3) -> list[int]:
        """The next ``k`` tokens after ``context``: trigram (order 3) backing off to bigram, then unigram."""
        seq = list(context[-2:])
        out = []
        for _ in range(k):
            nxt = self.tri.get(tuple(seq[-2:])) if order >= 3 and len(seq) >= 2 else None
            if nxt is None:
                nxt = self.bi.get(seq[-1], self.top) if seq else self.top
            out.append(nxt)
            seq.append(nxt)
        return out


def baseline_predictions(ngram: NgramBaseline, input_ids: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor,
                         block_size: int) -> dict[str, torch.Tensor]:
    """Per baseline, predicted tokens [b, A, B] (slot 0 = -1, never scored) from the context up to each anchor."""
    b, A = anchors.shape
    k = block_size - 1
    names = ("bigram", "trigram", "prompt_lookup", "lookup_else_trigram")
    preds = {n: torch.full((b, A, block_size), -1, dtype=torch.long) for n in names}
    ids = input_ids.cpu()
    for r in range(b):
        for j in range(A):
            if not valid[r, j]:
                continue
            t = int(anchors[r, j])
            ctx = ids[r, : t + 1]  # the anchor (bonus token) last
            cl = ctx.tolist()
            tri = ngram.chain(cl, k, 3)
            found = lookup(ctx, k, max_n=3, min_n=1)
            look = found[0] if found else []
            rows = {"bigram": ngram.chain(cl, k, 2), "trigram": tri,
                    "prompt_lookup": look + [-1] * (k - len(look)),
                    "lookup_else_trigram": look if look else tri}
            for n, p in rows.items():
                preds[n][r, j, 1:] = torch.tensor(p[:k])
    return preds


@torch.no_grad()
def heldout_report(objective, examples: list[Example], features_of, ngram: NgramBaseline | None,
                   batch_size: int = 8, seed: int = 0) -> dict:
    """The drafter's held-out per-slot accuracy (context as is / zeroed / shuffled) and the baselines.

    features_of(batch, rows) -> (features [b, T, K * H] of the drafter's layers, final hidden [b, T, H]
    or None; the teacher of loss 'kl', never ablated). Anchors are drawn
    with fixed seeds per sequence, so every call scores the same anchors.
    """
    if not examples:
        return {}
    batches = []
    for s in range(0, len(examples), batch_size):
        rows = [[e] for e in examples[s : s + batch_size]]
        batch = collate(rows, [seed * 1_000_003 + e.index for e in examples[s : s + batch_size]])
        batches.append((batch, rows, objective.blocks(batch)))
    B = batches[0][2].labels.shape[-1]  # block slots: the anchor, then the drafts
    feats = [features_of(batch, rows) for batch, rows, _ in batches]
    hits: dict[str, list[torch.Tensor]] = defaultdict(list)
    weights: list[torch.Tensor] = []
    finals = [x[1] for x in feats]
    feats = [x[0] for x in feats]
    for i, (batch, rows, bl) in enumerate(batches):
        f = feats[i]
        other = feats[(i + 1) % len(feats)] if len(feats) > 1 else f.roll(1, dims=0)  # another sequence's features
        T = f.shape[1]
        shuffled = torch.zeros_like(f)
        n = min(T, other.shape[1])
        shuffled[:, :n] = other[: f.shape[0], :n] if other.shape[0] >= f.shape[0] else other[:, :n].repeat(
            math.ceil(f.shape[0] / other.shape[0]), 1, 1)[: f.shape[0]]
        sel = bl.valid  # [b, A]
        w = bl.weights.cpu()
        weights.append(w[sel.cpu()])
        for name, x in (("drafter", f), ("context_zeroed", torch.zeros_like(f)), ("context_shuffled", shuffled)):
            out = objective(batch, bl, 1.0, features=x, final_h=finals[i])
            hits[name].append(out.correct.cpu()[sel.cpu()])
        if ngram is not None:
            labels = bl.labels.cpu()
            for name, p in baseline_predictions(ngram, batch.input_ids, bl.anchors.cpu(), sel.cpu(), B).items():
                hits[name].append((p == labels)[sel.cpu()])
    W = torch.cat(weights)  # [n_anchors, B]
    report = {}
    for name, hs in hits.items():
        m = acceptance_metrics(torch.cat(hs), W)
        report[name] = {"acc_per_slot": m["acc_per_slot"], "acc": m["acc"], "tau_proxy": m["tau_proxy"]}
    report["n_anchors"] = int((W[:, 1] > 0).sum())
    d1 = report["drafter"]["acc_per_slot"][0]
    ablated = max(report["context_zeroed"]["acc_per_slot"][0], report["context_shuffled"]["acc_per_slot"][0])
    report["ablation_ratio"] = ablated / d1 if d1 and d1 > 0 else float("nan")
    report["ignores_context"] = bool(d1 == 0 or report["ablation_ratio"] >= ABLATION_WARN_RATIO)
    return report


def format_report(report: dict, step: int) -> str:
    """A per-slot table: drafter, its ablations and the baselines on the same held-out anchors."""
    if not report:
        return ""
    rows = [k for k in report if isinstance(report[k], dict)]
    n = len(report["drafter"]["acc_per_slot"])
    head = "| predictor | " + " | ".join(f"slot {k}" for k in range(1, n + 1)) + " | tau proxy |"
    lines = [f"held-out accuracy at step {step} ({report['n_anchors']} anchors):", head, "|---" * (n + 2) + "|"]
    for r in rows:
        acc = report[r]["acc_per_slot"]
        lines.append(f"| {r} | " + " | ".join("-" if a != a else f"{a:.3f}" for a in acc) + f" | {report[r]['tau_proxy']:.2f} |")
    if report["ignores_context"]:
        lines.append(f"WARNING: with its context features zeroed or shuffled the drafter keeps "
                     f"{100 * report['ablation_ratio']:.0f}% of its slot-1 accuracy: it barely reads the target "
                     "(check the feature statistics; feature_norm 'channel'; more steps)")
    return "\n".join(lines)
