"""Recurrent layers of hybrid targets (gated DeltaNet, Mamba-2) under exact tree verification.

A KV cache can be compacted to the accepted path; a recurrent state cannot: it is a running summary
of every token fed through it. Feeding a draft tree's tokens through a recurrent layer in order lets
sibling branches leak into each other's outputs and into the state kept after the round.

Exact rule used here: every tree node's recurrent state is computed from its *parent's* state, one
token-step of the layer's own recurrence (the very step function the model's cached decoding uses),
batched over all nodes of one depth (a gather of parent states). The short causal convolution in
front of the recurrence reads each node's own ancestors (and, above the root, the committed conv
window). So a node's output depends on its root-to-node path only, and the state after a round is
the state stored at the last accepted node: :func:`commit` picks it, nothing is recomputed.

Cost: per recurrent layer, ``depth + 1`` sequential batched steps (instead of one chunked scan) and
one state per node kept until the walk has chosen the path. Families register the per-node step of
their mixer in :data:`FAMILIES` (keyed by the text config's ``model_type``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicLayer, LinearAttentionCacheLayerMixin, LinearAttentionLayer

from flashdraft.errors import FlashdraftError

NON_ATTENTION_LAYER_TYPES = frozenset({"linear_attention", "mamba", "conv", "mlp", "moe"})
"""``layer_types`` entries whose layers take no attention mask (recurrent mixers, plain MLP/MoE blocks)."""


class RecurrentError(FlashdraftError, ValueError):
    """A hybrid target used in a way that would not be exact; the message names the fix."""


@dataclass
class TreeLayout:
    """The shape of one verify forward as the recurrent layers see it.

    parents: [n] parent node of each node (-1: the committed state); parents precede children.
    levels: node indices grouped by depth (level d holds the nodes whose parent is in level d - 1).
    """

    parents: list[int]
    levels: list[torch.Tensor] = field(default_factory=list)
    _conv_index: dict[int, torch.Tensor] = field(default_factory=dict)
    _parent_index: torch.Tensor | None = None
    _offsets: torch.Tensor | None = None

    @classmethod
    def from_parents(cls, parents: list[int], device=None) -> "TreeLayout":
        depth: list[int] = []
        for i, p in enumerate(parents):
            if not -1 <= p < i:
                raise RecurrentError(f"tree parent {p} of node {i} must be -1 or an earlier node (parents precede children)")
            depth.append(0 if p < 0 else depth[p] + 1)
        by_level: list[list[int]] = [[] for _ in range(max(depth, default=-1) + 1)]
        for i, d in enumerate(depth):
            by_level[d].append(i)
        levels = [torch.tensor(lv, dtype=torch.long, device=device) for lv in by_level]
        return cls(parents=list(parents), levels=levels)

    def conv_index(self, width: int, device=None) -> torch.Tensor:
        """[n, width] indices into [committed window (width columns) | node inputs (n)]: each node's
        causal-conv window, oldest first, ending at the node itself and walking up its ancestors."""
        if width not in self._conv_index:
            rows: list[list[int]] = []
            for i, p in enumerate(self.parents):
                prev = rows[p][1:] if p >= 0 else list(range(1, width))  # above the root: committed columns
                rows.append(prev + [width + i])
            self._conv_index[width] = torch.tensor(rows, dtype=torch.long, device=device).view(-1, width)
        return self._conv_index[width]

    def parent_index(self, device=None) -> torch.Tensor:
        if self._parent_index is None:
            self._parent_index = torch.tensor(self.parents, dtype=torch.long, device=device)
        return self._parent_index

    def offsets(self, device=None) -> torch.Tensor:
        """[n] index of each node within its depth level (-> gathers from one level's states)."""
        if self._offsets is None:
            off = [0] * len(self.parents)
            for level in self.levels:
                for k, node in enumerate(level.tolist()):
                    off[node] = k
            self._offsets = torch.tensor(off, dtype=torch.long, device=device)
        return self._offsets

    def place(self, node: int) -> tuple[int, int]:
        """(depth, index within the depth level) of ``node``."""
        d, j = 0, node
        while self.parents[j] >= 0:
            d, j = d + 1, self.parents[j]
        return d, int(self.offsets()[node])


def tree_conv(x: torch.Tensor, committed: torch.Tensor, layout: TreeLayout, weight: torch.Tensor, bias, act: str | None):
    """Depthwise causal conv along each node's root path.

    x: [n, C] pre-conv inputs of the nodes; committed: [C, K] last K committed inputs; weight: [C, K].
    Returns (activated outputs [n, C], each node's window [n, C, K] = its conv state once committed).
    """
    K = weight.shape[-1]
    buf = torch.cat([committed.transpose(0, 1).to(x.dtype), x], dim=0)  # [K + n, C]
    windows = buf[layout.conv_index(K, x.device)].transpose(1, 2).contiguous()  # [n, C, K]
    out = F.conv1d(windows.to(weight.dtype), weight[:, None], bias, groups=weight.shape[0])[..., -1]  # [n, C]
    if act is not None:
        out = ACT2FN[act](out)
    return out.to(x.dtype), windows


def tree_scan(step: Callable, committed: torch.Tensor, layout: TreeLayout, n: int):
    """Run ``step(states [w, ...], nodes [w]) -> (outputs [w, ...], new states [w, ...])`` depth by depth,
    each node starting from its parent's state.

    Returns (outputs [n, ...], :class:`LevelStates`): states stay in one tensor per depth (a parent
    gather reads the previous level only; nothing is scattered into an [n, ...] buffer).
    """
    outs = None
    levels: list[torch.Tensor] = []
    for d, level in enumerate(layout.levels):
        if d == 0:
            init = committed.expand(len(level), *committed.shape[1:]).clone()
        else:
            init = levels[-1].index_select(0, layout.offsets(committed.device)[layout.parent_index(committed.device)[level]])
        out, new = step(init, level)
        levels.append(new)
        if outs is None:
            outs = torch.empty((n, *out.shape[1:]), dtype=out.dtype, device=out.device)
        outs[level] = out
    return outs, LevelStates(levels, layout)


@dataclass
class LevelStates:
    """Per-node recurrent states of a tree, stored per depth: ``levels[d][k]`` is the state after the
    k-th node of depth d."""

    levels: list[torch.Tensor]
    layout: TreeLayout

    def __getitem__(self, node: int) -> torch.Tensor:
        """State after ``node`` -> [1, ...]."""
        d, k = self.layout.place(node)
        return self.levels[d][k : k + 1]


def _modeling(mod: nn.Module):
    """The transformers modeling module a mixer comes from: its own step functions (kernel or torch)."""
    return sys.modules[type(mod).__module__]


def gated_deltanet_tree(mod: nn.Module, x: torch.Tensor, conv: torch.Tensor, state: torch.Tensor, layout: TreeLayout):
    """Qwen3.5 gated DeltaNet over a tree. x: [1, n, d]; conv: [C, K]; state: [1, Hv, dk, dv].
    Returns (output [1, n, d], node conv windows [n, C, K], node states (:class:`LevelStates` of [Hv, dk, dv]))."""
    fn = _modeling(mod).torch_recurrent_gated_delta_rule
    n = x.shape[1]
    qkv, windows = tree_conv(mod.in_proj_qkv(x)[0], conv, layout, mod.conv1d.weight[:, 0], mod.conv1d.bias, mod.activation)
    q, k, v = torch.split(qkv, [mod.key_dim, mod.key_dim, mod.value_dim], dim=-1)
    q, k = q.view(n, -1, mod.head_k_dim), k.view(n, -1, mod.head_k_dim)  # [n, Hk, dk]
    v = v.view(n, -1, mod.head_v_dim)  # [n, Hv, dv]
    if mod.num_v_heads // mod.num_k_heads > 1:
        q = q.repeat_interleave(mod.num_v_heads // mod.num_k_heads, dim=1)
        k = k.repeat_interleave(mod.num_v_heads // mod.num_k_heads, dim=1)
    beta = mod.in_proj_b(x)[0].sigmoid()  # [n, Hv]
    g = -mod.A_log.float().exp() * F.softplus(mod.in_proj_a(x)[0].float() + mod.dt_bias)  # [n, Hv]

    def step(init, nodes):
        out, new = fn(q[nodes, None], k[nodes, None], v[nodes, None], g=g[nodes, None], beta=beta[nodes, None],
                      initial_state=init, output_final_state=True, use_qk_l2norm_in_kernel=True)
        return out[:, 0], new  # [w, Hv, dv], [w, Hv, dk, dv]

    core, states = tree_scan(step, state, layout, n)
    z = mod.in_proj_z(x).reshape(-1, mod.head_v_dim)  # [n * Hv, dv]
    core = mod.norm(core.reshape(-1, mod.head_v_dim), z).reshape(1, n, -1)
    return mod.out_proj(core), windows, states


def mamba2_tree(mod: nn.Module, x: torch.Tensor, conv: torch.Tensor, state: torch.Tensor, layout: TreeLayout):
    """Nemotron-H Mamba-2 mixer over a tree. x: [1, n, d]; conv: [C, K]; state: [1, H, P, N].
    Returns (output [1, n, d], node conv windows [n, C, K], node states (:class:`LevelStates` of [H, P, N]))."""
    fn = _modeling(mod).mamba2_selective_state_update
    n, H, P, N, G = x.shape[1], mod.num_heads, mod.head_dim, mod.ssm_state_size, mod.n_groups
    gate, xbc, dt = mod.in_proj(x)[0].split([mod.intermediate_size, mod.conv_dim, H], dim=-1)
    xbc, windows = tree_conv(xbc, conv, layout, mod.conv1d.weight[:, 0], mod.conv1d.bias, mod.activation)
    xs, B, C = torch.split(xbc, [mod.intermediate_size, G * N, G * N], dim=-1)
    A = (-torch.exp(mod.A_log.float()))[:, None, None].expand(-1, P, N)  # [H, P, N]
    D, dt_bias = mod.D[:, None].expand(-1, P), mod.dt_bias[:, None].expand(-1, P)  # [H, P]

    def step(init, nodes):
        w = len(nodes)
        out = fn(init, xs[nodes].view(w, H, P), dt[nodes][:, :, None].expand(-1, -1, P), A, B[nodes].view(w, G, N),
                 C[nodes].view(w, G, N), D, z=None, dt_bias=dt_bias, dt_softplus=True)  # updates init in place
        return out.reshape(w, -1), init  # [w, H * P], [w, H, P, N]

    scan, states = tree_scan(step, state, layout, n)
    y = mod.norm(scan[None], gate[None])  # [1, n, H * P]
    return mod.out_proj(y.to(x.dtype)), windows, states


@dataclass(frozen=True)
class RecurrentFamily:
    """How to find a family's recurrent mixers and run them over a tree."""

    layer_type: str  # the config.layer_types entry of the recurrent layers
    mixer: Callable[[nn.Module], nn.Module]  # decoder layer -> recurrent mixer module
    tree_forward: Callable  # (mixer, x, conv [C, K], state, layout) -> (out, windows, states)
    conv_kernel: Callable[[nn.Module], int]


_GDN = RecurrentFamily("linear_attention", lambda layer: layer.linear_attn, gated_deltanet_tree, lambda m: m.conv_kernel_size)
_MAMBA2 = RecurrentFamily("linear_attention", lambda layer: layer.mixer, mamba2_tree, lambda m: m.conv_kernel_size)

FAMILIES: dict[str, RecurrentFamily] = {
    "qwen3_5_text": _GDN,  # Qwen3.5 / Qwen3.6 dense: gated DeltaNet + full attention
    "qwen3_5_moe_text": _GDN,
    "nemotron_h": _MAMBA2,  # Nemotron-H: Mamba-2 + attention + MLP blocks
}
"""Hybrid families with exact tree verification, by the text config's ``model_type``."""

KNOWN_UNSUPPORTED = (
    "qwen3_next", "falcon_h1", "granitemoehybrid", "jamba", "bamba", "zamba2", "lfm2", "falcon_mamba", "mamba2", "mamba",
)


def text_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def recurrent_family(config) -> RecurrentFamily | None:
    """The registered family of a hybrid target, None for a pure-attention target; refuses known
    recurrent families without exact tree support (their speculative decoding would not be lossless)."""
    cfg = text_config(config)
    mt = getattr(cfg, "model_type", "")
    if mt in FAMILIES:
        return FAMILIES[mt]
    types = getattr(cfg, "layer_types", None) or []
    if mt in KNOWN_UNSUPPORTED or any(t in ("linear_attention", "mamba", "conv") for t in types):
        raise RecurrentError(
            f"target family {mt!r} has recurrent layers but no exact tree verification in flashdraft yet "
            f"(supported hybrids: {', '.join(sorted(FAMILIES))}); use one of those or a pure-attention target"
        )
    return None


def recurrent_layer_ids(config) -> list[int]:
    fam = recurrent_family(config)
    if fam is None:
        return []
    return [i for i, t in enumerate(text_config(config).layer_types) if t == fam.layer_type]


class HybridCache(DynamicCache):
    """Full (never sliding) K/V for attention layers, conv + recurrent state for recurrent layers, and
    the per-node states of the last tree forward (``pending``) until :func:`commit` picks the path."""

    def __init__(self, config):
        cfg = text_config(config)
        rec = set(recurrent_layer_ids(config))
        layers = [
            LinearAttentionLayer() if (i in rec or t in NON_ATTENTION_LAYER_TYPES) else DynamicLayer()
            for i, t in enumerate(cfg.layer_types)
        ]
        Cache.__init__(self, layers=layers)
        self.recurrent_ids = sorted(rec)
        self.pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.pending_parents: list[int] | None = None


def is_recurrent_layer(layer) -> bool:
    return isinstance(layer, LinearAttentionCacheLayerMixin)


def _committed(layer) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(conv window [C, K], recurrent state [1, ...]) of a recurrent cache layer; None before the prefill."""
    conv = layer.conv_states[0] if layer.is_conv_states_initialized[0] else None
    state = layer.recurrent_states[0] if layer.is_recurrent_states_initialized[0] else None
    return (None if conv is None else conv[0]), state


@contextmanager
def tree_mixers(target, cache: HybridCache, parents: list[int]):
    """While active, the target's recurrent mixers compute every node from its own root path; their
    per-node states go to ``cache.pending`` (the committed state is left untouched)."""
    family = recurrent_family(target.config)
    layout = TreeLayout.from_parents(parents, device=target.device)
    cache.pending, cache.pending_parents = {}, list(parents)
    mods = {i: family.mixer(target.decoder_layers[i]) for i in cache.recurrent_ids}

    def make(i, mod):
        def forward(hidden_states, cache_params=None, attention_mask=None, **kwargs):
            if hidden_states.shape[0] != 1:
                raise RecurrentError("tree verification of a hybrid target runs at batch 1")
            layer = cache.layers[i]
            conv, state = _committed(layer)
            if conv is None or state is None:
                raise RecurrentError("the hybrid target's cache is empty: run the prompt (prefill) before a tree forward")
            out, windows, states = family.tree_forward(mod, hidden_states, conv, state, layout)
            cache.pending[i] = (windows, states)
            return out

        return forward

    try:
        for i, mod in mods.items():
            mod.forward = make(i, mod)
        yield
    finally:
        for mod in mods.values():
            mod.__dict__.pop("forward", None)


def check_root_path(parents: list[int], keep: list[int]) -> None:
    """Refuse kept nodes that are not a path from the root: no single recurrent state fits them."""
    for j, node in enumerate(keep):
        if not 0 <= node < len(parents) or parents[node] != (keep[j - 1] if j else -1):
            raise RecurrentError(f"kept nodes {keep} are not a root path of the verified tree (parents {parents})")


def commit(cache: HybridCache, keep: list[int]) -> None:
    """Make the recurrent state the one reached along ``keep`` (a root path of the last tree forward):
    the conv window and recurrent state stored at its last node. An empty ``keep`` keeps the state
    from before that forward."""
    if cache.pending_parents is None:
        if keep:
            raise RecurrentError(
                "the last forward committed the hybrid target's recurrent state already; verify drafts with "
                "tree_parents=... so the state can follow the accepted path"
            )
        return
    check_root_path(cache.pending_parents, keep)
    if keep:
        last = keep[-1]
        for i, (windows, states) in cache.pending.items():
            layer = cache.layers[i]
            layer.conv_states[0] = windows[last : last + 1].clone()  # [1, C, K]
            layer.recurrent_states[0] = states[last].clone()
    cache.pending, cache.pending_parents = {}, None


def recurrent_state_bytes(target) -> int:
    """Bytes of one node's recurrent state over all recurrent layers (what a tree keeps per node)."""
    ids = recurrent_layer_ids(target.config)
    return 0 if not ids else _probe_state_bytes(target, ids)


def _probe_state_bytes(target, ids: list[int]) -> int:
    cache = HybridCache(target.config)
    dev = target.device
    with torch.no_grad():
        target.model.get_decoder()(input_ids=torch.zeros(1, 1, dtype=torch.long, device=dev),
                                   position_ids=torch.zeros(1, 1, dtype=torch.long, device=dev),
                                   past_key_values=cache, use_cache=True)
    total = 0
    for i in ids:
        layer = cache.layers[i]
        total += layer.conv_states[0].numel() * layer.conv_states[0].element_size()
        total += layer.recurrent_states[0].numel() * layer.recurrent_states[0].element_size()
    return total
