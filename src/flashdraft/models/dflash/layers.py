"""The DFlash decoder layer: Qwen3-style attention with q/k RMSNorm and RoPE over [context K/V; block],
a SwiGLU MLP, and the RoPE tables and attention dispatch (SDPA or FlexAttention) they use."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

from flashdraft.models.dflash.config import DFlashConfig


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """Default RoPE tables for ``positions`` [n] -> cos, sin [1, n, head_dim]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [n, head_dim / 2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [n, head_dim]
    return emb.cos().to(dtype)[None], emb.sin().to(dtype)[None]


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """RoPE tables for per-row positions [b, n] -> cos, sin [b, n, head_dim]."""
    b, n = positions.shape
    cos, sin = rope_cos_sin(positions.flatten(), head_dim, theta, dtype)  # [1, b*n, hd]
    return cos.view(b, n, head_dim), sin.view(b, n, head_dim)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, gqa: bool) -> torch.Tensor:
    """Attention of q [b, h, q, hd] over k, v [b, kv_heads, n, hd]; ``mask`` is a dense bool mask
    (True = visible, SDPA), None (all visible), or a flex-attention ``BlockMask`` (training on GPUs)."""
    if mask is not None and not isinstance(mask, torch.Tensor):
        from flashdraft.models.dflash.masks import flex_attend

        return flex_attend(q, k, v, mask, gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


class DFlashAttention(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        d, b = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=b)
        self.k_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=b)
        self.v_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=b)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=b)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)

    def kv(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K (normed, rotated) and V of h [b, n, d] -> each [b, kv_heads, n, head_dim]."""
        b, n, _ = h.shape
        k = self.k_norm(self.k_proj(h).view(b, n, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(h).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        k, _ = apply_rotary_pos_emb(k, k, cos, sin)
        return k, v

    def forward(self, x, rope_x, ctx_kv, mask):
        """x: [b, q, d] block tokens; ctx_kv: (K, V) of the context, each [b, kv_heads, c, head_dim];
        mask: bool [q, c + q] (True = visible) or None (all visible)."""
        b, q, _ = x.shape
        cos, sin = rope_x
        qs = self.q_norm(self.q_proj(x).view(b, q, self.n_heads, self.head_dim)).transpose(1, 2)  # [b, h, q, hd]
        qs, _ = apply_rotary_pos_emb(qs, qs, cos, sin)
        kx, vx = self.kv(x, cos, sin)
        k = torch.cat([ctx_kv[0], kx], dim=2)  # [b, kv_heads, c + q, hd]
        v = torch.cat([ctx_kv[1], vx], dim=2)
        out = attend(qs, k, v, mask, gqa=self.n_heads != self.n_kv)  # [b, h, q, hd]
        return self.o_proj(out.transpose(1, 2).reshape(b, q, self.n_heads * self.head_dim))


class DFlashMLP(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.self_attn = DFlashAttention(cfg)
        self.mlp = DFlashMLP(cfg)
        self.input_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, x, rope_x, ctx_kv, mask):
        x = x + self.self_attn(self.input_layernorm(x), rope_x, ctx_kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))
