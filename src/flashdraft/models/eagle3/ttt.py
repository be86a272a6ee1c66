"""The EAGLE-3 training-time test: the draft layer unrolled ``steps`` times over packed rows.

Step 0 feeds, at every position ``i``, (embedding of x[i+1], fc(feature i)) at RoPE position ``i``,
with causal attention inside its own document: these are the step-0 keys/values, exactly the context
cache inference builds. Step ``k >= 1`` feeds, at ``i``, (embedding of x[i+k+1], the step-(k-1)
output at ``i``) at RoPE position ``i + k``, and attends to the step-0 entries of positions <= i in
the same document plus its own entries of steps 1..k at ``i`` (the "diagonal"): what inference's
draft step ``k`` sees when the round's context ends at ``i`` and the drafted tokens are x[i+2 ..].
Step k's output at ``i`` predicts x[i+k+2]. Rows whose x[i+k+1] lies past the document end carry an
arbitrary token; the objective drops them, and nothing else attends to their step-k entries.
"""

from __future__ import annotations

import torch

from flashdraft.models.dflash.layers import rope_tables


def shifted(ids: torch.Tensor, k: int) -> torch.Tensor:
    """ids [b, T] -> ids[:, i + k] at every i [b, T] (the last id repeated past the end)."""
    T = ids.shape[1]
    idx = (torch.arange(T, device=ids.device) + k).clamp_max(T - 1)
    return ids[:, idx]


def ttt_forward(drafter, features: torch.Tensor, input_ids: torch.Tensor, doc_ids: torch.Tensor,
                positions: torch.Tensor, steps: int) -> torch.Tensor:
    """features [b, T, K * Ht], input_ids / doc_ids (-1 = padding) / positions (inside the document) [b, T]
    -> pre-norm outputs of every step [steps, b, T, d]."""
    cfg, layer = drafter.cfg, drafter.midlayer
    dtype = drafter.fc.weight.dtype
    b, T = input_ids.shape
    rep = cfg.num_attention_heads // cfg.num_key_value_heads
    scale = cfg.head_dim ** -0.5
    idx = torch.arange(T, device=input_ids.device)
    visible = (idx[None, :, None] >= idx[None, None, :]) & (doc_ids[:, :, None] == doc_ids[:, None, :])  # [b, T, T]
    neg = torch.finfo(torch.float32).min

    hidden = drafter.fuse(features)  # [b, T, d]
    k0 = v0 = None
    diag_k: list[torch.Tensor] = []  # per step >= 1: [b, heads, T, hd]
    diag_v: list[torch.Tensor] = []
    outs = []
    for k in range(steps):
        emb = drafter.embed(shifted(input_ids, k + 1))  # [b, T, d]
        cos, sin = rope_tables(positions + k, cfg.head_dim, cfg.rope_theta, dtype)  # [b, T, hd]
        q, kk, vv = layer.qkv(emb, hidden, cos, sin)  # q [b, h, T, hd], kk / vv [b, kv, T, hd]
        kk, vv = kk.repeat_interleave(rep, dim=1), vv.repeat_interleave(rep, dim=1)  # [b, h, T, hd]
        if k == 0:
            k0, v0 = kk, vv
        else:
            diag_k.append(kk)
            diag_v.append(vv)
        ctx = (q.float() @ k0.float().transpose(-1, -2)) * scale  # [b, h, T, T]
        ctx = ctx.masked_fill(~visible[:, None], neg)
        diag = [(q.float() * dk.float()).sum(-1, keepdim=True) * scale for dk in diag_k]  # k x [b, h, T, 1]
        p = torch.softmax(torch.cat([ctx, *diag], dim=-1), dim=-1)  # [b, h, T, T + k]
        a = p[..., :T] @ v0.float()  # [b, h, T, hd]
        for j, dv in enumerate(diag_v):
            a = a + p[..., T + j : T + j + 1] * dv.float()
        hidden = layer.finish(a.to(q.dtype), hidden)  # [b, T, d]
        outs.append(hidden)
    return torch.stack(outs)  # [steps, b, T, d]
