"""The DFlash block-diffusion drafter, in the z-lab checkpoint format.

Architecture: Qwen3-style decoder layers (RMSNorm, attention with q/k RMSNorm and RoPE, SwiGLU MLP).
The target's features from ``target_layer_ids`` are concatenated and fused by ``fc`` (no bias) and
the RMSNorm ``hidden_norm`` into one context feature, which is projected into the K/V of *every*
layer (KV injection, same k/v projections as the block tokens, no ``input_layernorm``). Queries come
from the block only: [anchor/bonus token, MASK x (B-1)]; attention inside the block is
bidirectional (sliding-window layers are causal and windowed, as vLLM runs them). The token
embedding and LM head are borrowed from the target, frozen, and never saved with the drafter: a
drafter not bound to a target refuses to run. An optional reduced draft vocabulary carries its own
``lm_head`` plus the ``d2t`` (draft id -> target id offset) and ``t2d`` (bool over the target
vocabulary) maps, as vLLM reads them.

Feature scale. Target residual streams carry massive-activation channels (a few channels with
10-100x the RMS of the rest), which make ``fc``'s output, and so every context position, look alike.
Training therefore feeds ``fc`` the features times a static per-channel ``feature_scale`` (from
feature statistics, see :mod:`flashdraft.train.diagnostics`); the scale is a non-saved buffer and
is folded into ``fc.weight`` on save (fc(x * s) == (W * s) x), so the files stay in the z-lab format.

Files: ``config.json`` (``architectures``, ``block_size``, ``dflash_config.{mask_token_id,
target_layer_ids}``, ``num_target_layers``, layer sizes, ``layer_types``) and ``model.safetensors``
with ``layers.N.*``, ``fc.weight``, ``hidden_norm.weight``, ``norm.weight``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from flashdraft.models.dflash.config import DFlashConfig, DFlashInner
from flashdraft.models.dflash.layers import DFlashLayer, rope_cos_sin, rope_tables
from flashdraft.models.dflash.masks import flex_training_mask, training_mask
from flashdraft.models.draft_vocab import DraftVocab, DraftVocabHead
from flashdraft.models.drafter import DrafterError, DrafterFamily, check_target_fit, register_drafter
from flashdraft.models.feature_scale import FeatureScaled
from flashdraft.models.target import Target, check_target_layer_ids


@register_drafter("DFlashDraftModel")
class DFlashDrafter(DrafterFamily, DraftVocabHead, FeatureScaled, nn.Module):
    """DFlash drafter (a :class:`~flashdraft.models.drafter.Drafter`): :meth:`propose` is the inference
    step of the chain and tree decoders, :meth:`train_hidden` the training forward over many blocks."""

    norm_class = Qwen3RMSNorm
    config_class = DFlashConfig
    layer_class = DFlashLayer  # DFlash2 wraps it in local convolutions
    folder_kind = "a DFlash drafter folder"
    unbound_reason = "its embedding and LM head are borrowed from the target and never saved"

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.target_hidden_size, d, bias=False)
        self.hidden_norm = Qwen3RMSNorm(d, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList(self.layer_class(cfg, lt) for lt in cfg.layer_types)
        self.norm = Qwen3RMSNorm(d, eps=cfg.rms_norm_eps)
        self.init_feature_scale()  # buffer feature_scale [K * target_hidden], folded into fc.weight on save
        self.vocab: DraftVocab | None = None  # reduced draft vocabulary: buffers d2t [Vd], t2d [vocab]
        if cfg.draft_vocab_size is not None:
            self.lm_head = nn.Linear(d, cfg.draft_vocab_size, bias=False)
            self.vocab = DraftVocab(self, cfg.vocab_size, cfg.draft_vocab_size)
        self._target: Target | None = None
        self._ctx_cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.reset_parameters()

    # ---- construction, binding, files -------------------------------------------------------

    @property
    def block_size(self) -> int:
        return self.cfg.block_size

    @property
    def max_depth(self) -> int:
        """Draft positions per block: the bonus token takes slot 0 of B."""
        return self.cfg.block_size - 1

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Context vectors of target features [..., K * H] -> [..., d]: hidden_norm(fc(features * feature_scale))."""
        return self.hidden_norm(self.fc(self.scale_features(features)))

    @property
    def mask_token_id(self) -> int:
        return self.cfg.mask_token_id

    @classmethod
    def for_target(
        cls,
        target: Target,
        num_layers: int = 1,
        block_size: int = 16,
        target_layer_ids: list[int] | None = None,
        mask_token_id: int | None = None,
        intermediate_size: int | None = None,
        seed: int = 0,
        draft_vocab: torch.Tensor | None = None,
        **family_fields,
    ) -> "DFlashDrafter":
        """A freshly initialised drafter shaped for ``target`` (width, heads and vocabulary from it);
        ``draft_vocab`` [Vd] target ids gives it a reduced vocabulary (see :meth:`set_draft_vocab`);
        ``family_fields``: config fields of a subclass's family (DFlash2's convolutions and selector)."""
        tc = target.config
        ids = target_layer_ids if target_layer_ids is not None else target.default_layer_ids(num_layers)
        check_target_layer_ids(ids, target.num_layers, target.name)
        head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
        cfg = cls.config_class(
            block_size=block_size,
            dflash_config=DFlashInner(
                mask_token_id=mask_token_id if mask_token_id is not None else target.find_mask_token_id(),
                target_layer_ids=list(ids),
            ),
            num_target_layers=target.num_layers,
            target_hidden_size=target.hidden_size,
            hidden_size=target.hidden_size,
            intermediate_size=intermediate_size or tc.intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=tc.num_attention_heads,
            num_key_value_heads=getattr(tc, "num_key_value_heads", tc.num_attention_heads),
            head_dim=head_dim,
            rms_norm_eps=float(getattr(tc, "rms_norm_eps", 1e-6)),
            vocab_size=target.vocab_size,
            draft_vocab_size=int(draft_vocab.numel()) if draft_vocab is not None else None,
            **family_fields,
        )
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            drafter = cls(cfg)
        drafter = drafter.to(device=target.device, dtype=target.dtype).bind(target)
        if draft_vocab is not None:
            drafter.set_draft_vocab(draft_vocab)
        return drafter

    def grow_layers(self, num_layers: int) -> "DFlashDrafter":
        """A deeper copy of this drafter that drafts exactly as it does: its layers and every other weight
        kept, ``num_layers - len(self.layers)`` layers added on top (the last layer's type) whose output
        projections (``o_proj``, ``down_proj``) start at zero, so each adds nothing to the residual stream
        until training moves it. Bound to the same target."""
        have = len(self.layers)
        if num_layers < have:
            raise DrafterError(f"cannot grow a {have}-layer drafter to {num_layers} layers; num_layers must be >= {have}")
        types = list(self.cfg.layer_types) + [self.cfg.layer_types[-1]] * (num_layers - have)
        cfg = self.cfg.model_copy(update={"num_hidden_layers": num_layers, "layer_types": types})
        ref = self.fc.weight
        with torch.random.fork_rng():
            torch.manual_seed(num_layers)
            grown = type(self)(cfg).to(device=ref.device, dtype=ref.dtype)
        missing, unexpected = grown.load_state_dict(self.state_dict(), strict=False)
        if unexpected or any(not k.startswith(tuple(f"layers.{i}." for i in range(have, num_layers))) for k in missing):
            raise DrafterError(f"growing the drafter left weights unmatched: missing {missing[:8]}, unexpected {unexpected[:8]}")
        # the scale is not in the state dict; fc.weight was copied in its scaled (training) form
        grown.set_feature_scale(self.feature_scale, keep_function=False)
        for layer in grown.layers[have:]:
            nn.init.zeros_(layer.self_attn.o_proj.weight)
            nn.init.zeros_(layer.mlp.down_proj.weight)
        return grown.bind(self.target) if self._target is not None else grown

    def check_fits(self, target: Target) -> None:
        """Refuse a target whose width, vocabulary, depth or mask token do not match this drafter."""
        check_target_fit(self.cfg, target, borrows="embedding and LM head")
        c, who = self.cfg, f"target {target.name}"
        if not 0 <= c.mask_token_id < target.vocab_size:
            raise DrafterError(
                f"drafter mask_token_id {c.mask_token_id} is not a row of {who}'s embedding (vocabulary "
                f"{target.vocab_size}); set dflash_config.mask_token_id to a token that exists in the target"
            )

    # ---- inference -------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the context K/V of the previous generation."""
        self._ctx_cache = []

    def context_length(self) -> int:
        return self._ctx_cache[0][0].shape[2] if self._ctx_cache else 0

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary fp32 logits for drafter outputs h [m, d] -> [m, vocab]."""
        scores, ids = self.scores(h)
        return scores if ids is None else self.vocab.to_target_logits(scores)  # [m, draft_vocab] -> [m, vocab]

    def scores(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Drafter outputs h [m, d] -> (fp32 logits [m, C], target ids [C] of the columns): the draft vocabulary's
        C ids with a draft vocabulary, else (the target's [m, vocab] logits, None)."""
        from flashdraft.models.forward import head_rows, lm_logits

        if self.cfg.draft_vocab_size is None:
            return lm_logits(self.target, h), None
        return head_rows(self.lm_head, h).float(), self.vocab.token_ids()  # [m, draft_vocab]

    def block_mask(self, layer_type: str, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """Inference visibility: full layers see everything; sliding layers are causal and windowed."""
        if layer_type != "sliding_attention":
            return None
        rel = q_pos[:, None] - k_pos[None, :]  # [q, c + q]
        return (rel >= 0) & (rel < self.cfg.sliding_window)

    @torch.no_grad()
    def propose(self, tokens: torch.Tensor, new_features: torch.Tensor | None,
                hints: torch.Tensor | None = None) -> torch.Tensor:
        """One drafter pass for the block after ``tokens``.

        tokens: [start + 1] committed ids, the last being the bonus token at position ``start``;
        new_features: [n_new, K * hidden] target features of positions ``start - n_new .. start - 1``
        not yet in the drafter's context cache. Returns fp32 logits [B - 1, vocab] for positions
        start + 1 .. start + B - 1. Only the context K/V is kept; block K/V are discarded. ``hints``: [B - 1]
        ids for the draft slots instead of MASK (``block_hints``; :func:`flashdraft.decode.lookup.lookup_hints`).
        """
        return self.logits(self.propose_hidden(tokens, new_features, hints))

    @torch.no_grad()
    def propose_scores(self, tokens: torch.Tensor, new_features: torch.Tensor | None,
                       hints: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`propose` as (logits [B - 1, C], ids [C]) over the draft vocabulary (:meth:`scores`)."""
        return self.scores(self.propose_hidden(tokens, new_features, hints))

    @torch.no_grad()
    def propose_hidden(self, tokens: torch.Tensor, new_features: torch.Tensor | None,
                       hints: torch.Tensor | None = None) -> torch.Tensor:
        """The drafter pass of :meth:`propose` up to its final norm -> [B - 1, d]."""
        c, dev, dtype = self.cfg, tokens.device, next(self.parameters()).dtype
        start = tokens.shape[0] - 1
        past = self.context_length()
        n_new = 0 if new_features is None else new_features.shape[0]
        if past + n_new != start:
            raise DrafterError(f"drafter context has {past} + {n_new} positions but the bonus token sits at {start}")
        block = torch.full((c.block_size,), c.mask_token_id, dtype=torch.long, device=dev)
        block[0] = tokens[-1]
        if hints is not None:  # [B - 1] ids of the draft slots (MASK where there is no hint)
            block[1:] = hints
        x = self.target.model.get_input_embeddings()(block[None]).to(dtype)  # [1, B, d]
        q_pos = torch.arange(start, start + c.block_size, device=dev)  # [B]
        c_pos = torch.arange(past, start, device=dev)  # [n_new]
        rope_x = rope_cos_sin(q_pos, c.head_dim, c.rope_theta, dtype)
        rope_c = rope_cos_sin(c_pos, c.head_dim, c.rope_theta, dtype)
        ctx = self.fuse(new_features.to(dtype)[None]) if n_new else None  # [1, n_new, d]
        k_pos = torch.arange(0, start + c.block_size, device=dev)  # [start + B]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            if ctx is not None:
                k_new, v_new = attn.kv(ctx, *rope_c)  # [1, kv_heads, n_new, hd]
            else:
                k_new = v_new = x.new_zeros(1, attn.n_kv, 0, attn.head_dim)
            if i < len(self._ctx_cache):
                k_old, v_old = self._ctx_cache[i]
                k_new, v_new = torch.cat([k_old, k_new], 2), torch.cat([v_old, v_new], 2)
                self._ctx_cache[i] = (k_new, v_new)
            else:
                self._ctx_cache.append((k_new, v_new))
            x = layer(x, rope_x, (k_new, v_new), self.block_mask(layer.layer_type, q_pos, k_pos))
        return self.norm(x)[0, 1:]  # [B - 1, d]

    # ---- training ---------------------------------------------------------------------------

    def train_hidden(
        self,
        features: torch.Tensor,
        input_ids: torch.Tensor,
        doc_ids: torch.Tensor,
        positions: torch.Tensor,
        anchors: torch.Tensor,
        noise: float = 0.0,
        checkpoint_layers: bool = False,
        generator: torch.Generator | None = None,
        attention: str = "sdpa",
        block_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Drafter outputs for every slot of the blocks opened at ``anchors`` -> [b, A, B, d] (after the final norm).

        features: [b, T, K * H] target features; input_ids, doc_ids (-1 = padding), positions (inside
        the document): [b, T]; anchors: [b, A] indices into T. Each block is [token at the anchor,
        MASK x (B-1)], shaped exactly like :meth:`propose`'s, and sees the visibility of
        :func:`~flashdraft.models.dflash.masks.training_mask`. ``noise``: uniform +-noise on the fc input
        only; ``attention``: "sdpa" (dense bool masks) or "flex" (``BlockMask``, GPU); ``block_ids``: [b, A, B] the
        blocks' input ids when their draft slots hold hints (default: the anchor's token, then MASK).
        """
        c, B = self.cfg, self.block_size
        target = self.target  # raises if unbound
        dtype = next(self.parameters()).dtype
        b, A = anchors.shape
        feats = features.to(dtype)  # [b, T, K * H]
        if noise > 0:  # noise touches only the fc input, never the target's logits or labels
            u = torch.rand(feats.shape, generator=generator, device=feats.device, dtype=feats.dtype)
            feats = feats + (u * 2 - 1) * noise
        ctx = self.fuse(feats)  # [b, T, d]: hidden_norm(fc(feats * feature_scale))
        if block_ids is None:
            block_ids = torch.full((b, A, B), c.mask_token_id, dtype=torch.long, device=feats.device)  # [b, A, B]
            block_ids[..., 0] = input_ids.gather(1, anchors)
        x = target.model.get_input_embeddings()(block_ids.view(b, A * B)).to(dtype)  # [b, A*B, d]
        q_pos = (positions.gather(1, anchors)[..., None] + torch.arange(B, device=x.device)).view(b, A * B)  # [b, A*B]
        rope_x = rope_tables(q_pos, c.head_dim, c.rope_theta, dtype)
        rope_c = rope_tables(positions, c.head_dim, c.rope_theta, dtype)
        mask_fn = flex_training_mask if attention == "flex" else training_mask  # same visibility, BlockMask or dense
        masks = {lt: mask_fn(anchors, doc_ids, positions, B, lt, c.sliding_window) for lt in set(c.layer_types)}

        def run_layer(layer, x, ctx):
            return layer(x, rope_x, layer.self_attn.kv(ctx, *rope_c), masks[layer.layer_type])

        for layer in self.layers:
            if checkpoint_layers and torch.is_grad_enabled():
                x = checkpoint(run_layer, layer, x, ctx, use_reentrant=False)
            else:
                x = run_layer(layer, x, ctx)
        return self.norm(x).view(b, A, B, -1)  # [b, A, B, d]
