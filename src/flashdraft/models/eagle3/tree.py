"""EAGLE's dynamic draft tree (EAGLE-2/3 ``topK_genrate``), grown by an EAGLE-3 drafter.

1. The context pass (position start - 1) gives the root's draft distribution; its top-k tokens are the
   first frontier (depth 1), scored by their log-probabilities.
2. For each of ``depth`` steps the k frontier nodes run as ONE batched drafter forward (each at the
   position of its depth, attending to the context and to its own ancestors among this round's
   draft entries); each expands its top-k, giving k * k candidates scored by cumulative log-prob.
   All candidates are kept as possible leaves; the k best become the next frontier.
3. The global top ``total_tokens`` candidates form the tree. Ordered by (score desc, depth) a parent
   always precedes its children (a child's score adds a log-prob <= 0), so the cut is prefix-closed.

The tree's depth is at most ``depth + 1``; the drafter runs ``depth + 1`` sequential forwards.
"""

from __future__ import annotations

import torch

from flashdraft.decode.tree import DraftTree
from flashdraft.models.drafter import DrafterError


def dynamic_tree(drafter, tokens: torch.Tensor, new_features: torch.Tensor | None, top_k: int, depth: int,
                 total_tokens: int) -> DraftTree:
    """tokens [start + 1] committed ids (the bonus last), new_features [n_new, K * Ht] -> the tree
    (node 0 = the bonus; ``total_tokens`` drafted nodes at most)."""
    if top_k < 1 or depth < 0 or total_tokens < 1:
        raise DrafterError(f"dynamic tree needs top_k >= 1, depth >= 0, total_tokens >= 1; got {top_k}, {depth}, {total_tokens}")
    start = tokens.shape[0] - 1
    k = min(top_k, drafter.cfg.draft_vocab_size)
    h = drafter.ingest(tokens, new_features)  # [1, 1, d]
    lp = torch.log_softmax(drafter.draft_logits(h[0, 0]), dim=-1)  # [Vd]
    top_lp, top_ids = lp.topk(k)  # [k]
    # candidates (all nodes that may enter the tree): draft token id, parent candidate (-1 = root), score, depth
    c_tok, c_par, c_score, c_depth = [top_ids], [torch.full((k,), -1, device=lp.device)], [top_lp], [1]
    n_cand = k
    frontier = torch.arange(k, device=lp.device)  # candidate indices of the frontier
    f_score, f_hidden = top_lp, h.expand(1, k, -1)  # [k], [1, k, d]: the hidden each frontier node is fed
    f_entry_parent = torch.full((k,), -1, dtype=torch.long, device=lp.device)  # draft entry of each node's parent
    tok_all = top_ids
    anc = torch.zeros(0, 0, dtype=torch.bool, device=lp.device)  # [e, e] draft entry -> its ancestors-or-self
    kv = None
    for s in range(1, depth + 1):
        e = anc.shape[0]
        new_anc = torch.zeros(k, e + k, dtype=torch.bool, device=lp.device)  # [k, e + k]
        has_parent = f_entry_parent >= 0
        new_anc[has_parent, :e] = anc[f_entry_parent[has_parent]]
        new_anc[:, e:] = torch.eye(k, dtype=torch.bool, device=lp.device)
        ids = drafter.vocab.to_target_ids(tok_all[frontier])  # [k] target ids
        out, kv = drafter.step(ids, f_hidden, start - 1 + s, kv, new_anc)  # out [1, k, d]
        anc = torch.cat([torch.cat([anc, anc.new_zeros(e, k)], 1), new_anc], 0)  # [e + k, e + k]
        lp = torch.log_softmax(drafter.draft_logits(out[0]), dim=-1)  # [k, Vd]
        top_lp, top_ids = lp.topk(k, dim=-1)  # [k, k]
        cu = f_score[:, None] + top_lp  # [k, k] cumulative log-probs
        c_tok.append(top_ids.flatten())
        c_par.append(frontier.repeat_interleave(k))
        c_score.append(cu.flatten())
        c_depth.append(s + 1)
        best = cu.flatten().topk(k).indices  # [k] of k * k
        tok_all = torch.cat([tok_all, top_ids.flatten()])
        frontier = n_cand + best
        n_cand += k * k
        f_score, f_hidden = cu.flatten()[best], out[:, best // k]  # [k], [1, k, d]
        f_entry_parent = e + best // k
    return _select(drafter, int(tokens[-1]), c_tok, c_par, c_score, c_depth, total_tokens)


def _select(drafter, root: int, c_tok, c_par, c_score, c_depth, total_tokens: int) -> DraftTree:
    """The top ``total_tokens`` candidates as a DraftTree, nodes ordered by (score desc, depth)."""
    toks = drafter.vocab.to_target_ids(torch.cat(c_tok)).tolist()
    parents = torch.cat(c_par).tolist()
    scores = torch.cat(c_score).float().tolist()
    depths = [d for d, t in zip(c_depth, c_tok) for _ in range(t.numel())]
    order = sorted(range(len(toks)), key=lambda i: (-scores[i], depths[i], i))[:total_tokens]
    node_of = {-1: 0}
    tree = DraftTree(tokens=[root], parents=[-1], depths=[0], scores=[0.0], children=[{}])
    for i in order:
        if parents[i] not in node_of:
            raise DrafterError("dynamic tree selection is not prefix-closed (a candidate outranks its parent)")
        node, parent = len(tree.tokens), node_of[parents[i]]
        node_of[i] = node
        tree.tokens.append(toks[i])
        tree.parents.append(parent)
        tree.depths.append(depths[i])
        tree.scores.append(scores[i])
        tree.children.append({})
        tree.children[parent].setdefault(toks[i], node)
    return tree
