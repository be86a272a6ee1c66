"""The drafter interface every decoder and trainer uses, and the registry of drafter families.

A *family* (DFlash today, EAGLE-3 next) is a class that satisfies :class:`Drafter` and is registered
under the ``architectures`` name its ``config.json`` carries (``@register_drafter("DFlashDraftModel")``).
:func:`load_drafter` reads that name from a drafter folder and hands the folder to the family's
``from_pretrained``; nothing outside a family's own module names its class.

The decoding contract (:meth:`Drafter.propose`): given the committed tokens (the bonus token last)
and the target features of the committed positions the drafter has not seen yet, return draft
logits ``[max_depth, vocab]`` (fp32, target vocabulary) for the ``max_depth`` positions after the
bonus. A chain decoder takes their argmax, a tree decoder their per-position marginals. A family with a
draft vocabulary also offers ``propose_scores`` (the same logits over its own ids only), which the
decoders read through :func:`propose_scores`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Protocol, runtime_checkable

import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from torch import nn

from flashdraft.errors import FlashdraftError

if TYPE_CHECKING:
    from flashdraft.models.target import Target


class DrafterError(FlashdraftError, ValueError):
    """A drafter that does not fit its target or cannot be loaded; the message names both sides."""


@runtime_checkable
class Drafter(Protocol):
    """What the decoders and the trainer need from a drafter of any family."""

    @property
    def target_layer_ids(self) -> list[int]:
        """Target layers whose outputs (concatenated, [n, K * hidden]) the drafter reads; [] for none."""
        ...

    @property
    def max_depth(self) -> int:
        """Deepest draft position one round can propose (the rows of :meth:`propose`'s logits)."""
        ...

    def reset(self) -> None:
        """Forget the previous generation (context caches)."""
        ...

    def propose(self, tokens: torch.Tensor, new_features: torch.Tensor | None) -> torch.Tensor:
        """tokens [start + 1] committed ids (the bonus last); new_features [n_new, K * hidden] for the
        positions not yet seen -> fp32 draft logits [max_depth, vocab]."""
        ...


@runtime_checkable
class StepwiseDrafter(Drafter, Protocol):
    """A drafter that drafts one token per forward (EAGLE-3): any chain depth, and a dynamic tree.
    Decoders that need it check :func:`is_stepwise`, never a family name."""

    stepwise: bool  # True

    def propose(self, tokens: torch.Tensor, new_features: torch.Tensor | None, depth: int | None = None) -> torch.Tensor:
        """As :meth:`Drafter.propose`, with ``depth`` chain steps (default max_depth) -> fp32 logits [depth, vocab]."""
        ...

    def propose_tree(self, tokens: torch.Tensor, new_features: torch.Tensor | None, top_k: int, depth: int,
                     total_tokens: int):
        """Ingest as :meth:`propose`, then grow a dynamic tree -> an object with ``tokens``, ``parents``, ``depths``,
        ``scores`` lists over its nodes (node 0 = the bonus; parents first; siblings best first)."""
        ...


def propose_scores(drafter, tokens: torch.Tensor, new_features: torch.Tensor | None, **options
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:meth:`Drafter.propose` (with ``options``, e.g. a stepwise drafter's depth) as (logits [max_depth, C] fp32,
    ids [C]): the logits over only the C target ids the drafter can draft (its draft vocabulary), when its
    family offers ``propose_scores``; else (propose's [max_depth, vocab] logits, None). Decoders use it so
    that a draft vocabulary's few columns are never spread over the whole target vocabulary (on
    Gemma-3-270M's 262k ids, that spread and a softmax and top-k over it cost about as much as the
    drafter's own forward on a CPU)."""
    own = getattr(drafter, "propose_scores", None)
    if own is not None:
        return own(tokens, new_features, **options)
    return drafter.propose(tokens, new_features, **options), None


def is_stepwise(drafter) -> bool:
    """Whether ``drafter`` drafts token by token (:class:`StepwiseDrafter`)."""
    return bool(getattr(drafter, "stepwise", False)) and callable(getattr(drafter, "propose_tree", None))


# architectures name (config.json) -> family class with from_pretrained(path, target)
DRAFTERS: dict[str, type] = {}


class DrafterConfig(BaseModel):
    """The ``config.json`` fields every drafter family shares: the decoder-layer shape (Llama / Qwen3 field
    names) and what :func:`check_target_fit` compares with the target. A family's config adds its own fields
    (architectures, layer count, RoPE base, draft vocabulary, layer ids) and calls :meth:`check_layer_shape`
    from its validator. Unknown fields are kept on save."""

    model_config = ConfigDict(extra="allow")
    family_name: ClassVar[str] = "flashdraft"  # said in messages ("DFlash drafters use silu")

    architectures: list[str]  # the family's registry name first (see register_drafter)
    model_type: str
    num_target_layers: int
    target_hidden_size: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_scaling: None = None
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    vocab_size: int
    tie_word_embeddings: bool = False

    def check_layer_shape(self) -> None:
        """Refuse an activation other than silu, heads that do not group into the KV heads, and a
        ``draft_vocab_size`` (when set) outside 1..vocab_size."""
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported; {self.family_name} drafters use silu")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        dv = getattr(self, "draft_vocab_size", None)
        if dv is not None and not 0 < dv <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {dv} must be in 1..vocab_size {self.vocab_size}")


def check_target_fit(cfg, target: "Target", borrows: str) -> None:
    """Refuse ``target`` when the drafter config ``cfg`` (hidden_size, target_hidden_size, vocab_size,
    num_target_layers, target_layer_ids) was made for another width, vocabulary or depth; ``borrows``
    names what the drafter takes from the target (said when the vocabularies differ)."""
    from flashdraft.models.target import TargetError, check_target_layer_ids

    who = f"target {target.name}"
    if cfg.target_hidden_size != target.hidden_size or cfg.hidden_size != target.hidden_size:
        raise DrafterError(
            f"drafter hidden_size {cfg.hidden_size} (target_hidden_size {cfg.target_hidden_size}) does not match "
            f"{who} hidden_size {target.hidden_size}; use a drafter made for this target or pass --target"
        )
    if cfg.vocab_size != target.vocab_size:
        raise DrafterError(
            f"drafter vocab_size {cfg.vocab_size} does not match {who} vocabulary {target.vocab_size}; "
            f"the drafter borrows the target's {borrows}, so both must be the same"
        )
    if cfg.num_target_layers != target.num_layers:
        raise DrafterError(
            f"drafter was made for a target with {cfg.num_target_layers} layers, {who} has {target.num_layers}; "
            "use a drafter made for this target"
        )
    try:
        check_target_layer_ids(cfg.target_layer_ids, target.num_layers, target.name)
    except TargetError as e:
        raise DrafterError(f"drafter target_layer_ids do not fit: {e}") from None


def save_drafter_files(drafter, path: str | Path) -> Path:
    """Write ``drafter.cfg`` as config.json (with ``torch_dtype``) and its own weights as model.safetensors,
    ``fc.weight`` with the feature scale folded in (fc(x * s) == (W * s) x), atomically into ``path``."""
    import tempfile

    from safetensors.torch import save_file

    from flashdraft.io import atomic_replace_dir

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    cfg = drafter.cfg.model_dump(mode="json")
    cfg["torch_dtype"] = str(drafter.fc.weight.dtype).removeprefix("torch.")
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}
    state["fc.weight"] = drafter.folded_fc_weight()
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    atomic_replace_dir(tmp, path)
    return path


def read_safetensors(path: Path, error: type[Exception] = DrafterError) -> dict[str, torch.Tensor]:
    """The tensors of one ``.safetensors`` file; a truncated or corrupt file is an ``error`` naming it."""
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own SafetensorError (and OSError) on a bad file
        raise error(f"{path} is not a readable safetensors file ({str(e).splitlines()[0]}): it is truncated or "
                    "corrupt; copy or export the drafter again") from None


def read_drafter_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Every *.safetensors tensor of a drafter folder, minus ``embed_tokens.weight``: served formats may ship
    the target's (pre-scaled) embedding table, while flashdraft always borrows the target's own module."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise DrafterError(f"no .safetensors weights in {path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(read_safetensors(f))
    state.pop("embed_tokens.weight", None)
    return state


def load_weights_exactly(drafter, state: dict[str, torch.Tensor], path: str | Path) -> None:
    """Load ``state`` into ``drafter``, refusing missing or unexpected names (both listed), shapes other than the
    config makes (the first few listed) and non-finite values (NaN or inf: the drafter would propose garbage
    while decoding stayed lossless, only slower)."""
    own = drafter.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise DrafterError(f"weights in {path} do not match config.json: missing {missing[:8]}, unexpected {unexpected[:8]}")
    wrong = [f"{k} {list(state[k].shape)} in the file, {list(v.shape)} from config.json" for k, v in own.items()
             if tuple(state[k].shape) != tuple(v.shape)]
    if wrong:
        raise DrafterError(f"weights in {path} do not match its config.json: {'; '.join(wrong[:3])}; the config was "
                           "edited or belongs to another drafter: restore the folder as it was written")
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise DrafterError(f"weights in {path} hold NaN or inf values ({', '.join(bad[:4])}"
                           f"{' ...' if len(bad) > 4 else ''}); the run that wrote them diverged: use an earlier "
                           "checkpoint or retrain with a lower learning rate")
    drafter.load_state_dict(state)


class DrafterFamily:
    """What the drafter families (nn.Modules that borrow parts of their target and keep them out of their
    files) share: initialisation, binding, the folder's files. A family sets ``norm_class`` (its RMSNorm),
    ``config_class`` (its ``config.json`` model), ``folder_kind`` (said when config.json is missing) and
    ``unbound_reason`` (what it borrows, said when it runs unbound), keeps ``self.cfg`` and ``self._target``
    and defines ``check_fits`` and ``reset``; :meth:`file_state_names` maps the tensor names a file may
    carry to the family's own."""

    norm_class: type
    config_class: type
    folder_kind = "a drafter folder"
    unbound_reason = "it borrows parts of the target, which are never saved"

    def reset_parameters(self, std: float = 0.02) -> None:
        """Linear weights ~ N(0, std), biases 0, RMSNorm weights 1."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, self.norm_class):
                nn.init.ones_(m.weight)

    @property
    def target_layer_ids(self) -> list[int]:
        return self.cfg.target_layer_ids

    def bind(self, target: "Target"):
        """Borrow what the family borrows from ``target`` (after checking that the drafter fits it)."""
        self.check_fits(target)
        self._target = target
        self.reset()
        return self

    @property
    def target(self) -> "Target":
        if self._target is None:
            raise DrafterError(
                f"drafter is not bound to a target: {self.unbound_reason}; load it with "
                f"{type(self).__name__}.from_pretrained(path, target) or call .bind(target)"
            )
        return self._target

    def save_pretrained(self, path: str | Path) -> Path:
        """Write config.json + model.safetensors (own weights, the family's names) atomically into ``path``."""
        return save_drafter_files(self, path)

    @classmethod
    def load_config(cls, path: str | Path):
        p = Path(path) / "config.json"
        if not p.is_file():
            raise DrafterError(f"{p} not found; {cls.folder_kind} holds config.json and model.safetensors")
        from flashdraft.config import validation_message

        try:
            return cls.config_class.model_validate_json(p.read_text())
        except ValidationError as e:
            raise DrafterError(validation_message(e, f"{p} is not a {cls.config_class.family_name} drafter config")
                               + "; fix the field or write the folder again (train, export or import)") from None

    @classmethod
    def file_state_names(cls, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors of a folder under the family's state-dict names (default: as stored)."""
        return state

    @classmethod
    def from_pretrained(cls, path: str | Path, target: "Target | None" = None):
        """Load a drafter folder; with ``target``, check the fit, move to its device and dtype and bind it."""
        cfg = cls.load_config(path)
        drafter = cls(cfg)
        if target is not None:
            drafter.check_fits(target)  # before the weights: a drafter for another target is named as such
        load_weights_exactly(drafter, cls.file_state_names(read_drafter_weights(path)), path)
        if target is not None:
            drafter.to(device=target.device, dtype=target.dtype).bind(target)
        return drafter


def register_drafter(architecture: str) -> Callable[[type], type]:
    """Class decorator: drafter folders whose ``config.json`` names ``architecture`` load with this class."""

    def wrap(cls: type) -> type:
        if architecture in DRAFTERS and DRAFTERS[architecture] is not cls:
            raise DrafterError(f"drafter architecture {architecture!r} is already registered to {DRAFTERS[architecture].__name__}")
        DRAFTERS[architecture] = cls
        cls.architecture = architecture
        return cls

    return wrap


def _builtin_families() -> None:
    from flashdraft.models import dflash, eagle3  # noqa: F401  (register DFlashDraftModel, LlamaForCausalLMEagle3)


def drafter_architecture(path: str | Path) -> str:
    """The ``architectures[0]`` name in ``path``/config.json."""
    p = Path(path) / "config.json"
    if not p.is_file():
        raise DrafterError(f"{p} not found; a drafter folder holds config.json and *.safetensors weights")
    try:
        archs = json.loads(p.read_text()).get("architectures") or []
    except json.JSONDecodeError as e:
        raise DrafterError(f"{p} is not valid JSON ({e}); re-export the drafter") from None
    if not archs:
        raise DrafterError(f"{p} has no 'architectures' entry; set it to one of {', '.join(drafter_families())}")
    return str(archs[0])


def drafter_families() -> list[str]:
    """Registered architecture names, sorted."""
    _builtin_families()
    return sorted(DRAFTERS)


def drafter_class(architecture: str) -> type:
    """The family class registered under ``architecture``."""
    _builtin_families()
    if architecture not in DRAFTERS:
        raise DrafterError(
            f"no drafter family is registered for architecture {architecture!r}; known: {', '.join(sorted(DRAFTERS))} "
            "(register one with flashdraft.models.drafter.register_drafter)"
        )
    return DRAFTERS[architecture]


def load_drafter(path: str | Path, target: "Target | None" = None):
    """Load the drafter folder ``path`` with the family its config.json names; with ``target``, check
    the fit, move it to the target's device and dtype and bind it."""
    return drafter_class(drafter_architecture(path)).from_pretrained(path, target)
