"""The EAGLE-3 decoder layer, computed as vLLM's ``llama_eagle3.LlamaDecoderLayer`` (layer 0) does.

Inputs per position: a token embedding ``e`` and a hidden state ``h`` (the fused target feature
``fc(features)`` at step 0, the layer's own pre-norm output afterwards), both [.., d]:

    x   = cat(input_layernorm(e), hidden_norm(h))          # [.., 2d]: q/k/v read 2d inputs
    r   = h + o_proj(attention(q, k, v))                   # the residual starts at h (not normed)
    out = r + mlp(post_attention_layernorm(r))             # pre-norm output, fed to the next step
    logits = lm_head(norm(out))

Llama attention: no q/k norms, neox RoPE at the position, scale head_dim ** -0.5. The layer is split
into :meth:`Eagle3Layer.qkv` and :meth:`Eagle3Layer.finish` so inference (a KV cache, a tree mask)
and training (the unrolled training-time test) run the same projections around their own attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from flashdraft.models.eagle3.config import Eagle3Config


class Eagle3MLP(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        d, m, b = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Linear(d, m, bias=b)
        self.up_proj = nn.Linear(d, m, bias=b)
        self.down_proj = nn.Linear(m, d, bias=b)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3Attention(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        d, b = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(2 * d, self.n_heads * self.head_dim, bias=b)
        self.k_proj = nn.Linear(2 * d, self.n_kv * self.head_dim, bias=b)
        self.v_proj = nn.Linear(2 * d, self.n_kv * self.head_dim, bias=b)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=b)


class Eagle3Layer(nn.Module):
    """State-dict names as EAGLE-3 checkpoints carry them under ``midlayer.``."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Eagle3Attention(cfg)
        self.mlp = Eagle3MLP(cfg)
        self.input_layernorm = LlamaRMSNorm(d, eps=eps)
        self.hidden_norm = LlamaRMSNorm(d, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(d, eps=eps)

    def qkv(self, emb: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """emb, hidden [b, n, d]; cos, sin [b or 1, n, head_dim] -> q [b, heads, n, hd], k, v [b, kv_heads, n, hd]."""
        a = self.self_attn
        b, n, _ = emb.shape
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(hidden)], dim=-1)  # [b, n, 2d]
        q = a.q_proj(x).view(b, n, a.n_heads, a.head_dim).transpose(1, 2)
        k = a.k_proj(x).view(b, n, a.n_kv, a.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(b, n, a.n_kv, a.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def finish(self, attn: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """attn [b, heads, n, hd] (attention output), hidden [b, n, d] (the residual) -> pre-norm output [b, n, d]."""
        b, h, n, hd = attn.shape
        r = hidden + self.self_attn.o_proj(attn.transpose(1, 2).reshape(b, n, h * hd))
        return r + self.mlp(self.post_attention_layernorm(r))
