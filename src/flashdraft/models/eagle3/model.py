"""The EAGLE-3 drafter, in the file format vLLM's ``eagle3`` method loads (``LlamaForCausalLMEagle3``).

Architecture (as vLLM's ``llama_eagle3.py`` computes it, see :mod:`flashdraft.models.eagle3.layers`):
three target features concatenated [n, 3 * Ht] -> bias-free ``fc`` -> [n, H]; ONE decoder layer over
cat(input_layernorm(embedding), hidden_norm(hidden)); final ``norm``; ``lm_head`` over a reduced draft
vocabulary with vLLM's ``d2t`` (draft id -> target id offset) and ``t2d`` (bool over the target
vocabulary) buffers. Position ``i`` is fed (embedding of token ``i + 1``, fused feature of ``i``) at
RoPE position ``i`` and predicts token ``i + 2``; a draft step feeds back the layer's pre-norm output.

Embedding. The token embedding is the target's embedding *module*, frozen and never saved. vLLM
shares the target's ``embed_tokens`` module with the drafter when the file ships none: with
``model_impl="transformers"`` that module is HF's (Gemma's ``Gemma3TextScaledWordEmbedding`` scales
by sqrt(H) inside it), so the drafter sees the scaled rows, as here; vLLM's native Gemma-3 class
scales outside its ``VocabParallelEmbedding``, so an export for it ships the scaled table as
``embed_tokens.weight`` (vLLM then keeps it separate). Either way the drafter reads what HF's
embedding module outputs, which is what it was trained on.

Feature scale: see :mod:`flashdraft.models.feature_scale` (folded into ``fc.weight`` on save).

Files: ``config.json`` (:class:`~flashdraft.models.eagle3.config.Eagle3Config`) and
``model.safetensors`` with ``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``,
``d2t``, ``t2d`` (vLLM maps ``midlayer.`` to ``layers.0.``).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from flashdraft.models.dflash.layers import attend, rope_cos_sin
from flashdraft.models.draft_vocab import DraftVocab, DraftVocabHead
from flashdraft.models.drafter import DrafterError, DrafterFamily, check_target_fit, register_drafter
from flashdraft.models.eagle3.config import Eagle3Config, Eagle3Inner
from flashdraft.models.eagle3.layers import Eagle3Layer
from flashdraft.models.feature_scale import FeatureScaled
from flashdraft.models.target import Target, check_target_layer_ids, default_target_layer_ids

DEFAULT_DRAFT_VOCAB = 32_000  # EAGLE-3's draft vocabulary on 8B targets (capped at the target's vocabulary)


def eagle_layer_ids(num_target_layers: int) -> list[int]:
    """EAGLE's feature layers (the inputs of layers 2, L/2 and L-3) as flashdraft ids (layer outputs):
    [1, L//2 - 1, L - 4]; a target too shallow for three distinct ones (L < 8) gets the house rule
    :func:`~flashdraft.models.target.default_target_layer_ids` for three features."""
    ids = [1, num_target_layers // 2 - 1, num_target_layers - 4]
    return ids if len(set(ids)) == 3 and ids[0] < ids[1] < ids[2] else default_target_layer_ids(num_target_layers, 3)


@register_drafter("LlamaForCausalLMEagle3")
class Eagle3Drafter(DrafterFamily, DraftVocabHead, FeatureScaled, nn.Module):
    """EAGLE-3 drafter (a :class:`~flashdraft.models.drafter.Drafter` that drafts step by step):
    :meth:`propose` is the chain, :meth:`propose_tree` EAGLE's dynamic tree, :meth:`ttt_hidden` the
    unrolled training forward (:mod:`flashdraft.models.eagle3.ttt`)."""

    norm_class = LlamaRMSNorm
    config_class = Eagle3Config
    folder_kind = "an EAGLE-3 drafter folder"
    unbound_reason = "its token embedding is the target's and never saved"

    stepwise = True  # drafts one token per forward, so decoders may ask for any depth or a dynamic tree
    decode_methods = ("eagle3", "eagle3_tree")  # the chain and tree decoders bench decode runs it with

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.target_hidden_size, d, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = LlamaRMSNorm(d, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(d, cfg.draft_vocab_size, bias=False)
        self.vocab = DraftVocab(self, cfg.vocab_size, cfg.draft_vocab_size)  # buffers d2t [Vd], t2d [vocab]
        self.init_feature_scale()
        self._target: Target | None = None
        self._ctx_kv: tuple[torch.Tensor, torch.Tensor] | None = None  # context K, V [1, kv_heads, past, hd]
        self.reset_parameters()

    # ---- construction, binding, files -------------------------------------------------------

    @property
    def max_depth(self) -> int:
        return self.cfg.max_depth

    @classmethod
    def for_target(
        cls,
        target: Target,
        target_layer_ids: list[int] | None = None,
        draft_vocab: torch.Tensor | None = None,
        max_depth: int = 7,
        intermediate_size: int | None = None,
        rope_theta: float = 10_000.0,
        seed: int = 0,
    ) -> "Eagle3Drafter":
        """A freshly initialised drafter shaped for ``target``; ``draft_vocab`` [Vd] target ids (default:
        the first min(32000, V) ids; training sets it from token counts, see :meth:`set_draft_vocab`)."""
        tc = target.config
        ids = list(target_layer_ids) if target_layer_ids is not None else eagle_layer_ids(target.num_layers)
        check_target_layer_ids(ids, target.num_layers, target.name)
        if draft_vocab is None:
            draft_vocab = torch.arange(min(DEFAULT_DRAFT_VOCAB, target.vocab_size))
        cfg = Eagle3Config(
            eagle3_config=Eagle3Inner(target_layer_ids=ids, max_depth=max_depth),
            num_target_layers=target.num_layers,
            target_hidden_size=target.hidden_size,
            hidden_size=target.hidden_size,
            intermediate_size=intermediate_size or tc.intermediate_size,
            num_attention_heads=tc.num_attention_heads,
            num_key_value_heads=getattr(tc, "num_key_value_heads", None) or tc.num_attention_heads,
            head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
            rms_norm_eps=float(getattr(tc, "rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            max_position_embeddings=int(getattr(tc, "max_position_embeddings", 32768)),
            vocab_size=target.vocab_size,
            draft_vocab_size=int(torch.as_tensor(draft_vocab).numel()),
        )
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            drafter = cls(cfg)
        drafter = drafter.to(device=target.device, dtype=target.dtype).bind(target)
        drafter.set_draft_vocab(draft_vocab)
        return drafter

    def check_fits(self, target: Target) -> None:
        """Refuse a target whose width, vocabulary or depth do not match this drafter."""
        check_target_fit(self.cfg, target, borrows="embedding")

    @classmethod
    def file_state_names(cls, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """vLLM's own name for the decoder layer (``layers.0.``) -> ``midlayer.``."""
        return {k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k: v for k, v in state.items()}

    # ---- the pieces every path shares --------------------------------------------------------

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings from the target's own embedding module: ids [...] -> [..., d]."""
        return self.target.model.get_input_embeddings()(ids).to(self.fc.weight.dtype)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [..., K * Ht] -> the step-0 hidden input fc(features * feature_scale) [..., d]."""
        return self.fc(self.scale_features(features))

    def rope(self, positions: torch.Tensor):
        """RoPE tables for positions [n] -> cos, sin [1, n, head_dim]."""
        return rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, self.fc.weight.dtype)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Pre-norm layer outputs [..., d] -> draft-vocabulary logits [..., Vd] (fp32)."""
        from flashdraft.models.forward import head_rows

        h = self.norm(out)
        return head_rows(self.lm_head, h.reshape(-1, h.shape[-1])).reshape(*h.shape[:-1], -1).float()

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Pre-norm layer outputs [m, d] -> target-vocabulary fp32 logits [m, V], -inf outside the draft vocabulary."""
        return self.vocab.to_target_logits(self.draft_logits(out))

    # ---- inference -------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the context K/V of the previous generation."""
        self._ctx_kv = None

    def context_length(self) -> int:
        return 0 if self._ctx_kv is None else self._ctx_kv[0].shape[2]

    def ingest(self, tokens: torch.Tensor, new_features: torch.Tensor | None) -> torch.Tensor:
        """Extend the context cache by the committed positions ``past .. start - 1`` (position i fed
        (embedding of tokens[i + 1], fc(feature i))) -> the pre-norm output at position start - 1 [1, 1, d]."""
        start = tokens.shape[0] - 1
        past = self.context_length()
        n_new = 0 if new_features is None else new_features.shape[0]
        if past + n_new != start:
            raise DrafterError(f"drafter context has {past} + {n_new} positions but the bonus token sits at {start}")
        if n_new == 0:
            raise DrafterError("an EAGLE-3 drafter needs the target features of the last committed position; got none")
        dev = tokens.device
        emb = self.embed(tokens[past + 1 : start + 1])[None]  # [1, n_new, d]
        hid = self.fuse(new_features)[None]  # [1, n_new, d]
        q, k, v = self.midlayer.qkv(emb, hid, *self.rope(torch.arange(past, start, device=dev)))
        if self._ctx_kv is not None:
            k, v = torch.cat([self._ctx_kv[0], k], 2), torch.cat([self._ctx_kv[1], v], 2)  # [1, kv, start, hd]
        self._ctx_kv = (k, v)
        q_pos = torch.arange(past, start, device=dev)
        causal = q_pos[:, None] >= torch.arange(start, device=dev)[None, :]  # [n_new, start]
        a = attend(q, k, v, causal, gqa=self.cfg.num_attention_heads != self.cfg.num_key_value_heads)
        return self.midlayer.finish(a, hid)[:, -1:]  # [1, 1, d]

    def step(self, ids: torch.Tensor, hidden: torch.Tensor, position: int, draft_kv, visible: torch.Tensor | None):
        """One draft step for m nodes at ``position``: ids [m], hidden [1, m, d] (their parents' outputs);
        draft_kv: (K, V) [1, kv, e, hd] of this round's earlier draft entries or None; visible [m, e + m] bool
        over those entries and the new ones (None: a chain, everything visible). Returns (outputs [1, m, d],
        draft K/V extended by the m new entries)."""
        m = ids.shape[0]
        pos = torch.full((m,), position, dtype=torch.long, device=ids.device)
        q, k, v = self.midlayer.qkv(self.embed(ids)[None], hidden, *self.rope(pos))
        if draft_kv is not None:
            k, v = torch.cat([draft_kv[0], k], 2), torch.cat([draft_kv[1], v], 2)  # [1, kv, e + m, hd]
        ck, cv = self._ctx_kv
        mask = None
        if visible is not None:
            mask = torch.cat([visible.new_ones(m, ck.shape[2]), visible], dim=1)  # [m, past + e + m]
        a = attend(q, torch.cat([ck, k], 2), torch.cat([cv, v], 2), mask,
                   gqa=self.cfg.num_attention_heads != self.cfg.num_key_value_heads)
        return self.midlayer.finish(a, hidden), (k, v)

    def propose(self, tokens: torch.Tensor, new_features: torch.Tensor | None, depth: int | None = None) -> torch.Tensor:
        """The chain after ``tokens`` [start + 1] (the bonus last): ingest ``new_features`` [n_new, K * Ht]
        (positions start - n_new .. start - 1), then ``depth`` (default max_depth) greedy steps, each feeding
        back its own output and argmax token. Returns fp32 logits [depth, V] for positions start + 1 ..
        start + depth. Draft-step K/V are dropped: the next round re-ingests the accepted positions."""
        return self.vocab.to_target_logits(self.propose_scores(tokens, new_features, depth)[0])

    @torch.no_grad()
    def propose_scores(self, tokens: torch.Tensor, new_features: torch.Tensor | None, depth: int | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`propose` as (logits [depth, Vd] over the draft vocabulary, its target ids [Vd])."""
        depth = self.max_depth if depth is None else depth
        if depth < 1:
            raise DrafterError(f"draft depth must be >= 1, got {depth}")
        h = self.ingest(tokens, new_features)  # [1, 1, d]
        rows = [self.draft_logits(h[0])]  # [1, Vd] each
        start, kv = tokens.shape[0] - 1, None
        for s in range(1, depth):
            tok = self.vocab.to_target_ids(rows[-1].argmax(dim=-1))  # [1]
            h, kv = self.step(tok, h, start - 1 + s, kv, None)
            rows.append(self.draft_logits(h[0]))
        return torch.cat(rows, dim=0), self.vocab.token_ids()  # [depth, Vd], [Vd]

    @torch.no_grad()
    def propose_tree(self, tokens: torch.Tensor, new_features: torch.Tensor | None, top_k: int = 10, depth: int = 7,
                     total_tokens: int = 60):
        """EAGLE's dynamic tree after ``tokens`` -> :class:`~flashdraft.models.eagle3.tree.DynamicTree` (root = the
        bonus; the fields of ``flashdraft.decode.tree.DraftTree``); see :func:`flashdraft.models.eagle3.tree.dynamic_tree`."""
        from flashdraft.models.eagle3.tree import dynamic_tree

        return dynamic_tree(self, tokens, new_features, top_k, depth, total_tokens)

    # ---- training ---------------------------------------------------------------------------

    def ttt_hidden(self, features, input_ids, doc_ids, positions, steps: int):
        """The unrolled training-time test -> pre-norm outputs [steps, b, T, d]; see
        :func:`flashdraft.models.eagle3.ttt.ttt_forward`."""
        from flashdraft.models.eagle3.ttt import ttt_forward

        return ttt_forward(self, features, input_ids, doc_ids, positions, steps)
