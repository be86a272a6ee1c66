"""Training diagnostics: feature statistics, the feature scale, n-gram baselines and the context ablation.

A drafter can fail silently: trained on features it cannot read, it learns the most frequent tokens
and its loss still goes down. These figures tell a user whether it reads the target:

* :func:`feature_stats` - per target layer, the channel RMS and the share of the energy its top
  channels hold (massive activations: one channel holding most of the energy);
* :func:`feature_scale` - the per-channel (or per-layer) input scale of ``fc`` that equalises them;
* :class:`NgramBaseline` - bigram/trigram chains fitted on the training data, prompt lookup and
  "lookup, else trigram", scored on the same held-out anchors as the drafter;
* :func:`heldout_report` - the drafter's held-out per-slot accuracy, with its context features as
  they are, zeroed, and shuffled across sequences, next to those baselines, all scored against
  what a greedy decoder accepts (:func:`reference_tokens`);
* :func:`walk_taus` - the rounds a greedy decoder makes over a held-out sequence (anchors right after
  each miss), whose mean tau is what real decoding measures; the mean over random anchors
  (``tau_proxy``) overstates it.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter, defaultdict

import torch

from flashdraft.decode.lookup import lookup
from flashdraft.decode.tree import best_first_tree, tree_marginals
from flashdraft.models.forward import lm_logits
from flashdraft.train.data import Example, collate
from flashdraft.train.objective import acceptance_metrics, anchor_candidates

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
def reference_tokens(target, blocks, final_h: torch.Tensor | None, chunk: int = 256) -> torch.Tensor:
    """[b, A, B] what a greedy decoder accepts at each supervised block slot (-1 elsewhere; a slot outside a
    draft vocabulary included: a drafter's walk counts it a miss, a drafter-free baseline may hit it), the one
    reference every predictor is scored against: with the target's final hidden states ``final_h``
    [b, T, H], its full-vocabulary argmax at anchor + k - 1 (on human text too, where the data's token
    often differs); without them the data's own tokens (the target's answers, for regenerated data)."""
    scored = blocks.supervised if blocks.supervised is not None else blocks.weights > 0  # [b, A, B]
    if final_h is None:
        return torch.where(scored, blocks.labels, -1).cpu()
    b, T, H = final_h.shape
    B = blocks.labels.shape[-1]
    src = (blocks.anchors[..., None] + torch.arange(B, device=blocks.anchors.device) - 1).clamp(0, T - 1)  # [b, A, B]
    flat = torch.arange(b, device=src.device)[:, None, None] * T + src
    pos, inverse = flat[scored].unique(return_inverse=True)  # a position feeds up to B - 1 slots: one argmax
    h = final_h.reshape(b * T, H).index_select(0, pos.to(final_h.device)).to(target.dtype)  # [u, H]
    arg = torch.cat([lm_logits(target, h[i : i + chunk]).argmax(-1) for i in range(0, h.shape[0], chunk)] or
                    [torch.zeros(0, dtype=torch.long, device=h.device)])
    ref = torch.full_like(blocks.labels, -1)
    ref[scored] = arg.to(ref.device)[inverse]
    return ref.cpu()


def decode_anchors(batch, blocks) -> torch.Tensor:
    """[b, A] bool (CPU): the block anchors a greedy decoder's round can start at: valid, and the anchor and the
    token after it are supervised data of one document (what a decoder produces)."""
    cand = torch.stack([anchor_candidates(m, i) for m, i in zip(batch.loss_mask, batch.doc_ids)])  # [b, T]
    return blocks.valid.cpu() & cand.cpu().gather(1, blocks.anchors.cpu())


def walk_taus(correct: torch.Tensor, weights: torch.Tensor, anchors: torch.Tensor, can_anchor: torch.Tensor) -> list[int]:
    """The rounds a greedy speculative decoder makes over each row, from blocks at every anchor.

    correct, weights: [b, A, B]; anchors [b, A] (sorted); can_anchor [b, A]: the anchor and the token
    after it are data a decoder produces (supervised, one document). From a row's first such anchor, a
    round accepts the leading correct scored slots and adds the bonus (tau = accepted + 1; an unscored
    slot, e.g. a token outside the draft vocabulary, is a miss); the next round anchors right after
    them, as decoding does, or at the next position that can anchor. Rounds start right after a miss,
    so their mean tau is below the mean over random anchors (``tau_proxy``).
    """
    chain = (correct & (weights > 0))[..., 1:].long().cumprod(-1).sum(-1)  # [b, A] accepted slots per anchor
    return rounds_from(chain, anchors, can_anchor)


def rounds_from(chain: torch.Tensor, anchors: torch.Tensor, can_anchor: torch.Tensor) -> list[int]:
    """The taus of a greedy decoder's rounds, given ``chain`` [b, A]: the drafts a round opened at each anchor
    would accept (see :func:`walk_taus`)."""
    taus: list[int] = []
    for r in range(anchors.shape[0]):
        ok = can_anchor[r]
        starts = dict(zip(anchors[r][ok].tolist(), chain[r][ok].tolist()))
        order = sorted(starts)
        i = 0
        while i < len(order):
            tau = starts[order[i]] + 1
            taus.append(tau)
            i = bisect_left(order, order[i] + tau, lo=i + 1)
    return taus


@torch.no_grad()
def heldout_report(objective, examples: list[Example], features_of, ngram: NgramBaseline | None,
                   batch_size: int = 8, seed: int = 0, walk: int = 16) -> dict:
    """The drafter's held-out per-slot accuracy (context as is / zeroed / shuffled) and the baselines.

    features_of(batch, rows) -> (features [b, T, K * H] of the drafter's layers, final hidden [b, T, H]
    or None; the teacher of loss 'kl', never ablated). Anchors are drawn
    with fixed seeds per sequence, so every call scores the same anchors. Every predictor is scored
    against :func:`reference_tokens`. ``walk``: on the first ``walk`` sequences, the drafter and the
    baselines also draft at every anchor and :func:`walk_taus` gives the tau of a greedy decoder's
    rounds (``walk_tau``), which real decoding measures; 0 skips it.
    """
    if not examples:
        return {}
    target = objective.drafter.target
    batches = []
    for s in range(0, len(examples), batch_size):
        rows = [[e] for e in examples[s : s + batch_size]]
        batch = collate(rows, [seed * 1_000_003 + e.index for e in examples[s : s + batch_size]])
        batches.append((batch, rows, objective.blocks(batch, evaluate=True)))
    B = batches[0][2].labels.shape[-1]  # block slots: the anchor, then the drafts
    feats = [features_of(batch, rows) for batch, rows, _ in batches]
    hits: dict[str, list[torch.Tensor]] = defaultdict(list)
    weights: list[torch.Tensor] = []
    selector = [0.0, 0.0, 0.0]  # DFlash2 selector: label in the unary top-k, pick right, supervised slots
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
        sel = bl.valid.cpu()  # [b, A]
        ref = reference_tokens(target, bl, finals[i])  # [b, A, B]
        weights.append(bl.weights.cpu()[sel])
        for name, x in (("drafter", f), ("context_zeroed", torch.zeros_like(f)), ("context_shuffled", shuffled)):
            out = objective(batch, bl, 1.0, features=x, final_h=finals[i])
            hits[name].append((out.pred.cpu() == ref)[sel])
            if name == "drafter" and getattr(objective, "last_unary_pred", None) is not None:  # DFlash2: before reranking
                hits["drafter_unary"].append((objective.last_unary_pred.cpu() == ref)[sel])
                inside, right, n = objective._selector_stats
                selector = [a + b for a, b in zip(selector, (inside, right, n))]
        if ngram is not None:
            for name, p in baseline_predictions(ngram, batch.input_ids, bl.anchors.cpu(), sel, B).items():
                hits[name].append((p == ref)[sel])
    W = torch.cat(weights)  # [n_anchors, B]
    report = {}
    if selector[2]:  # DFlash2: the label among the unary top-k, and the selector's pick right when it was
        report["candidate_recall"] = selector[0] / selector[2]
        report["selector_acc"] = selector[1] / selector[0] if selector[0] else math.nan
    for name, hs in hits.items():
        m = acceptance_metrics(torch.cat(hs), W)
        report[name] = {"acc_per_slot": m["acc_per_slot"], "acc": m["acc"], "tau_proxy": m["tau_proxy"]}
    report["n_anchors"] = int((W[:, 1] > 0).sum())
    if walk > 0:
        report["walk_rounds"] = _walk(objective, examples[:walk], features_of, ngram, seed, report)
    d1 = report["drafter"]["acc_per_slot"][0]
    ablated = max(report["context_zeroed"]["acc_per_slot"][0], report["context_shuffled"]["acc_per_slot"][0])
    report["ablation_ratio"] = ablated / d1 if d1 and d1 > 0 else float("nan")
    report["ignores_context"] = bool(d1 == 0 or report["ablation_ratio"] >= ABLATION_WARN_RATIO)
    return report


@torch.no_grad()
def walk_batch(objective, batch, features: torch.Tensor, final_h: torch.Tensor | None,
               ngram: NgramBaseline | None = None) -> dict[str, list[int]]:
    """Blocks at every anchor of ``batch``, scored against :func:`reference_tokens` -> per predictor (the
    drafter, and the baselines with ``ngram``) the :func:`walk_taus` of a greedy decoder's rounds."""
    bl = objective.blocks(batch, every_anchor=True, evaluate=True)
    ref = reference_tokens(objective.drafter.target, bl, final_h)
    anchors, valid, w = bl.anchors.cpu(), bl.valid.cpu(), bl.weights.cpu()
    can_anchor = decode_anchors(batch, bl)  # [b, A]
    out = {"drafter": walk_taus(objective(batch, bl, 1.0, features=features, final_h=final_h).pred.cpu() == ref, w,
                                anchors, can_anchor)}
    if ngram is not None:  # scored on every token the target said: no draft vocabulary caps a baseline
        free = bl.supervised.cpu().float() if bl.supervised is not None else w
        for name, p in baseline_predictions(ngram, batch.input_ids, anchors, valid, bl.labels.shape[-1]).items():
            out[name] = walk_taus(p == ref, free, anchors, can_anchor)
    return out


def tree_accepts(tree, reference: list[int]) -> int:
    """How many of ``reference`` (the tokens a greedy decoder accepts after the root; -1 = not scored, a miss)
    a walk of ``tree`` from its root accepts: it follows the child holding each next token while there is one."""
    node, n = 0, 0
    for tok in reference:
        node = tree.children[node].get(tok, -1) if tok >= 0 else -1
        if node < 0:
            break
        n += 1
    return n


@torch.no_grad()
def walk_tree_batch(objective, batch, features: torch.Tensor, final_h: torch.Tensor | None, budget: int,
                    temperatures: tuple[float, ...] = (1.0,)) -> dict[float, dict[str, list]]:
    """DDTree's rounds over ``batch``: at every anchor the best-first tree of ``budget`` nodes built from the
    drafter's marginals at softmax temperature T, walked against :func:`reference_tokens`. Per T: ``taus``,
    the :func:`rounds_from` taus (T = 1: the tree DDTree decodes with); ``accepted`` and ``expected``, per
    anchor the drafts the walk accepts and the tree's own estimate of it (the sum of its nodes' prefix
    probabilities, what cost sizing trusts)."""
    d = objective.drafter
    bl = objective.blocks(batch, every_anchor=True, evaluate=True)
    ref = reference_tokens(d.target, bl, final_h)  # [b, A, B]
    anchors, can_anchor = bl.anchors.cpu(), decode_anchors(batch, bl)  # [b, A] each
    h = d.train_hidden(features, batch.input_ids, batch.doc_ids, batch.positions, bl.anchors,
                       block_ids=bl.inputs)  # [b, A, B, d]: the blocks as decoding drafts them (hints included)
    head = objective.head(d.target)
    ids = getattr(head, "ids", None)  # [C] target ids of a draft vocabulary, None for the full one
    at = can_anchor.nonzero().tolist()  # [(row, anchor)] in order
    sel = can_anchor.to(h.device)
    rows = h[sel][:, 1:]  # [n, B-1, d]: the drafted slots of every block a round can open
    logits = head(rows.reshape(-1, rows.shape[-1])).float().view(*rows.shape[:2], -1)  # [n, B-1, C]
    want = ref[can_anchor][:, 1:].tolist()  # [n][B-1]
    out = {}
    for t in temperatures:
        trees = [best_first_tree(0, lp, budget, ids) for lp in tree_marginals(logits, t)]
        accepted = [tree_accepts(tree, w) for tree, w in zip(trees, want)]
        chain = torch.zeros(anchors.shape, dtype=torch.long)
        for (r, a), n in zip(at, accepted):
            chain[r, a] = n
        out[t] = {"accepted": accepted, "expected": [sum(math.exp(x) for x in tree.scores[1:]) for tree in trees],
                  "taus": rounds_from(chain, anchors, can_anchor)}
    return out


TREE_TEMPERATURES = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.15, 1.3)  # the grid calibrate_tree searches


@torch.no_grad()
def calibrate_tree(objective, examples: list[Example], features_of, budget: int = 32, seed: int = 0,
                   temperatures: tuple[float, ...] = TREE_TEMPERATURES) -> dict:
    """The softmax temperature at which DDTree's tree (``budget`` nodes) estimates its own acceptance right.

    A tree's estimate of the drafts a round accepts is the sum of its nodes' prefix probabilities, products
    of per-depth marginals; a drafter's slots err together, so at T = 1 that product understates how often
    a deep prefix is accepted, and cost sizing then cuts trees that would pay. On ``examples`` (held out)
    each T's tree is walked at every anchor (:func:`walk_tree_batch`); the returned ``tree_temperature`` is
    where the mean estimate meets the mean accepted (log-linear between grid points, clamped to the grid).
    Also per T: ``accepted``, ``expected`` (means per anchor) and the walk's ``walk_tau`` over its ``rounds``."""
    acc: dict[float, list[int]] = defaultdict(list)
    est: dict[float, list[float]] = defaultdict(list)
    taus: dict[float, list[int]] = defaultdict(list)
    for s in range(0, len(examples), 2):
        rows = [[e] for e in examples[s : s + 2]]
        batch = collate(rows, [seed * 1_000_003 + e.index for e in examples[s : s + 2]])
        for t, x in walk_tree_batch(objective, batch, *features_of(batch, rows), budget, temperatures).items():
            acc[t] += x["accepted"]
            est[t] += x["expected"]
            taus[t] += x["taus"]
    ts = sorted(t for t in temperatures if acc[t])
    if not ts:
        return {}
    ratio = {t: math.log(max(sum(est[t]), 1e-9) / max(sum(acc[t]), 1e-9)) for t in ts}  # falls as T grows
    best = ts[0] if ratio[ts[0]] <= 0 else ts[-1]
    for lo, hi in zip(ts, ts[1:]):
        if ratio[lo] > 0 >= ratio[hi]:
            best = lo + (hi - lo) * ratio[lo] / (ratio[lo] - ratio[hi])
            break
    return {"tree_temperature": round(best, 3), "budget": budget, "anchors": len(acc[ts[0]]),
            "per_temperature": {t: {"accepted": sum(acc[t]) / len(acc[t]), "expected": sum(est[t]) / len(est[t]),
                                    "walk_tau": sum(taus[t]) / len(taus[t]), "rounds": len(taus[t])} for t in ts}}


def _walk(objective, examples: list[Example], features_of, ngram: NgramBaseline | None, seed: int,
          report: dict, batch_size: int = 2) -> int:
    """Each predictor's ``walk_tau`` over ``examples`` into ``report`` -> the drafter's rounds walked."""
    taus: dict[str, list[int]] = defaultdict(list)
    for s in range(0, len(examples), batch_size):
        rows = [[e] for e in examples[s : s + batch_size]]
        batch = collate(rows, [seed * 1_000_003 + e.index for e in examples[s : s + batch_size]])
        for name, t in walk_batch(objective, batch, *features_of(batch, rows), ngram).items():
            taus[name] += t
    for name, t in taus.items():
        report[name]["walk_tau"] = sum(t) / len(t) if t else math.nan
    return len(taus["drafter"])


def format_report(report: dict, step: int) -> str:
    """A per-slot table: drafter, its ablations and the baselines on the same held-out anchors, with
    the tau of a greedy decoder's rounds (``walk tau``) where it was measured."""
    if not report:
        return ""
    rows = [k for k in report if isinstance(report[k], dict)]
    n = len(report["drafter"]["acc_per_slot"])
    head = "| predictor | " + " | ".join(f"slot {k}" for k in range(1, n + 1)) + " | tau proxy | walk tau |"
    walk = f", walk tau over {report['walk_rounds']} decode rounds" if "walk_rounds" in report else ""
    lines = [f"held-out accuracy at step {step} ({report['n_anchors']} anchors{walk}):", head, "|---" * (n + 3) + "|"]
    for r in rows:
        acc = report[r]["acc_per_slot"]
        w = report[r].get("walk_tau", math.nan)
        lines.append(f"| {r} | " + " | ".join("-" if a != a else f"{a:.3f}" for a in acc)
                     + f" | {report[r]['tau_proxy']:.2f} | " + ("-" if w != w else f"{w:.2f}") + " |")
    if "candidate_recall" in report:
        lines.append(f"selector (teacher-forced, supervised slots): label in the unary top-k {report['candidate_recall']:.3f}, "
                     f"pick right where it was {report['selector_acc']:.3f}; drafter = after reranking, drafter_unary "
                     "= the unary argmax before it")
    if report["ignores_context"]:
        lines.append(f"WARNING: with its context features zeroed or shuffled the drafter keeps "
                     f"{100 * report['ablation_ratio']:.0f}% of its slot-1 accuracy: it barely reads the target "
                     "(check the feature statistics; feature_norm 'channel'; more steps)")
    return "\n".join(lines)
