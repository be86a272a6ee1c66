"""Tiny randomly initialised targets (Qwen3, Gemma3, Llama; hybrids Qwen3.5 and Nemotron-H) and oracle drafters for tests."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, NemotronHConfig, Qwen3_5TextConfig, Qwen3Config

from flashdraft.models.eagle3 import Eagle3Drafter
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


HYBRIDS = ("qwen3_5", "nemotron_h")
"""Tiny hybrid families: gated DeltaNet + attention (Qwen3.5) and Mamba-2 + attention + MLP (Nemotron-H)."""


def tiny_hybrid_config(family: str, **kw):
    """Same width as :func:`tiny_config` (hidden 32, 4 heads of 8): recurrent layers around attention."""
    common = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, max_position_embeddings=1024, eos_token_id=None, bos_token_id=None, pad_token_id=None,
        initializer_range=0.3, tie_word_embeddings=False,
    )
    if family == "qwen3_5":
        common.update(
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"],
            linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
            linear_num_value_heads=4,
        )
        common.update(kw)
        common["num_hidden_layers"] = len(common["layer_types"])
        return Qwen3_5TextConfig(**common)
    if family == "nemotron_h":
        # time_step_min is also the dt clamp of the chunked scan (not of the cached step): keep it out of reach
        common.update(
            layers_block_type=["linear_attention", "mlp", "full_attention", "linear_attention", "mlp", "linear_attention"],
            ssm_state_size=8, mamba_num_heads=4, mamba_head_dim=8, n_groups=2, conv_kernel=4, chunk_size=16,
            time_step_min=1e-6, time_step_floor=1e-6,
        )
        common.update(kw)
        return NemotronHConfig(**common)
    raise ValueError(family)


def tiny_target(family: str = "qwen3", seed: int = 0, **kw) -> Target:
    cfg = tiny_config(family, **kw)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    return wrap_model(model, None, name=f"tiny-{family}")


@torch.no_grad()
def tiny_hybrid(family: str = "qwen3_5", seed: int = 0, **kw) -> Target:
    """A tiny random hybrid target (see :data:`HYBRIDS`)."""
    cfg = tiny_hybrid_config(family, **kw)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
        if family == "nemotron_h":  # dt = softplus(.. + dt_bias) around [0.05, 0.5]: the SSM state weighs in the outputs
            for layer in model.model.layers:
                if layer.block_type == "linear_attention":
                    dt = torch.empty_like(layer.mixer.dt_bias).uniform_(0.05, 0.5)
                    layer.mixer.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
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

    @property
    def max_depth(self) -> int:
        return self.block_size - 1

    def reset(self) -> None:
        pass

    @torch.no_grad()
    def propose(self, tokens: torch.Tensor, new_features) -> torch.Tensor:
        ids = tokens[None]
        out = []
        for _ in range(self.block_size - 1):  # plain uncached forwards: cheap for tiny models, no shared code
            nxt = self.target.model(ids).logits[0, -1].argmax()
            out.append(int(nxt))
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
        # [B - 1, V]: a clear winner per position, the rest a fixed random ranking for DDTree siblings
        g = torch.Generator().manual_seed(int(tokens.sum()))
        logits = torch.randn(self.block_size - 1, self.target.vocab_size, generator=g)
        logits[torch.arange(len(out)), out] = self.margin
        return logits


def random_prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB - 1, (length,), generator=g).tolist() for _ in range(n)]


class ScriptedDrafter:
    """Proposes the next tokens of a known reference continuation, deliberately wrong at every
    ``corrupt_every``-th position (the right token then ranks second, so a DDTree sibling can recover
    it). Exercises partial acceptance, off-spine walks and cache compaction on any target cheaply."""

    target_layer_ids: list[int] = []

    def __init__(self, vocab_size: int, prompt_len: int, reference: list[int], block_size: int = 8, corrupt_every: int = 5):
        self.vocab_size, self.prompt_len, self.reference = vocab_size, prompt_len, reference
        self.block_size, self.corrupt_every = block_size, corrupt_every

    @property
    def max_depth(self) -> int:
        return self.block_size - 1

    def reset(self) -> None:
        pass

    def propose(self, tokens: torch.Tensor, new_features) -> torch.Tensor:
        start = tokens.shape[0] - 1  # position of the bonus token
        logits = torch.zeros(self.block_size - 1, self.vocab_size)
        for k in range(self.block_size - 1):
            j = start + 1 + k - self.prompt_len  # index into the reference continuation
            true = self.reference[j] if j < len(self.reference) else 0
            if j % self.corrupt_every == self.corrupt_every - 1:
                logits[k, (true + 1) % self.vocab_size] = 20.0
                logits[k, true] = 19.0
            else:
                logits[k, true] = 20.0
        return logits


class Eagle3Oracle(Eagle3Drafter):
    """An EAGLE-3 drafter whose draft distribution is the target's own (draft vocabulary = the whole
    vocabulary). Its "hidden state" [.., d] carries the drafted path (token ids, -1 padded), so the
    chain and the dynamic tree run their real bookkeeping (frontiers, parents, hidden hand-over) and
    greedy drafts are always the target's choices. Make it with ``Eagle3Oracle.for_target(target)``."""

    @classmethod
    def for_target(cls, target: Target, max_depth: int = 7, **kw) -> "Eagle3Oracle":
        return super().for_target(target, draft_vocab=torch.arange(target.vocab_size), max_depth=max_depth, **kw)

    def ingest(self, tokens: torch.Tensor, new_features) -> torch.Tensor:
        self._committed = tokens
        return torch.full((1, 1, self.cfg.hidden_size), -1.0)  # the empty path

    def step(self, ids, hidden, position, draft_kv, visible):
        out = hidden.clone()  # [1, m, d]
        depth = int((hidden[0, 0] >= 0).sum())  # every node of one step has the same depth
        out[0, :, depth] = ids.float()
        return out, None

    @torch.no_grad()
    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        rows = out.reshape(-1, out.shape[-1])  # [m, d]
        depth = int((rows[0] >= 0).sum())
        seqs = torch.cat([self._committed[None].expand(rows.shape[0], -1), rows[:, :depth].long()], dim=1)
        keys = [tuple(r) for r in seqs.tolist()]
        memo = self.__dict__.setdefault("_memo", {})  # sequence -> target logits (sampling tests repeat prefixes)
        todo = sorted({k for k in keys if k not in memo})
        if todo:
            for k, row in zip(todo, self.target.model(torch.tensor(todo)).logits[:, -1].float()):
                memo[k] = row
        return torch.stack([memo[k] for k in keys]).reshape(*out.shape[:-1], -1)  # [.., V]
