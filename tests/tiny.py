"""Tiny randomly initialised targets (Qwen3, Gemma3, Llama) and an oracle drafter for tests."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen3Config

from flashdraft.models.target import Target, wrap_model

VOCAB = 96
MASK_ID = VOCAB - 1


def tiny_config(family: str, **kw):
    common = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=1024, eos_token_id=None, bos_token_id=None,
        pad_token_id=None, initializer_range=0.3, tie_word_embeddings=False,
    )
    common.update(kw)
    if family == "qwen3":
        return Qwen3Config(**common)
    if family == "llama":
        return LlamaConfig(**common)
    if family == "gemma3":
        common.setdefault("sliding_window", 8)
        common["num_key_value_heads"] = 1
        common["query_pre_attn_scalar"] = 8
        common["tie_word_embeddings"] = True
        return Gemma3TextConfig(**common)
    raise ValueError(family)


def tiny_target(family: str = "qwen3", seed: int = 0, **kw) -> Target:
    cfg = tiny_config(family, **kw)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    return wrap_model(model, None, name=f"tiny-{family}")


@torch.no_grad()
def hf_greedy(target: Target, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation by HF ``generate`` (its own cache and masks): the independent reference."""
    ids = torch.tensor([prompt])
    out = target.model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0
    )
    return out[0, len(prompt):].tolist()


class OracleDrafter:
    """Proposes the target's own greedy continuation: full acceptance at T = 0 (tau = B)."""

    target_layer_ids: list[int] = []

    def __init__(self, target: Target, block_size: int = 8, margin: float = 20.0):
        self.target, self.block_size, self.margin = target, block_size, margin

    def reset(self) -> None:
        pass

    @torch.no_grad()
    def propose(self, tokens: torch.Tensor, new_features) -> torch.Tensor:
        out = hf_greedy(self.target, tokens.tolist(), self.block_size - 1)
        # [B - 1, V]: a clear winner per position, the rest a fixed random ranking for DDTree siblings
        g = torch.Generator().manual_seed(int(tokens.sum()))
        logits = torch.randn(self.block_size - 1, self.target.vocab_size, generator=g)
        logits[torch.arange(len(out)), out] = self.margin
        return logits


def random_prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB - 1, (length,), generator=g).tolist() for _ in range(n)]
