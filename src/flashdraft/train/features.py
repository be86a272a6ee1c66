"""Offline target features: run the frozen target once over the training examples, store what
:func:`~flashdraft.models.forward.target_pass` returns, and read it back per example.

On disk (one folder)::

    features.json              manifest, written (atomically) before any shard
    shard-00000.safetensors    examples 0 .. shard_size-1
    shard-00001.safetensors    examples shard_size .. 2*shard_size-1, ...

A shard holds, for its n examples of N tokens in all (rows of an example are contiguous):
``features`` [N, K*H] (K = len(layer_ids), layer order as in the manifest), ``final`` [N, H] (only
with ``with_final``: the target's last hidden state after its final norm, for the KL loss),
``token_ids`` [N] int64, ``loss_mask`` [N] bool, ``offsets`` [n+1] int64 (local row offsets),
``index`` [n] int64 (:attr:`Example.index`). Its safetensors metadata repeats the manifest ``key``
and the shard number, so a resumed run trusts only shards written for the same cache.

Each example runs alone through the target (exactly the per-example numbers, no padding effects).

A cache grows with its data: when the examples now are the cached ones plus more after them (e.g. a
generation run that was resumed with more prompts), the shards that hold the same examples as before
are kept (re-tagged with the new manifest key) and only the others are computed.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from flashdraft.io import atomic_path, atomic_write_text, make_output_dir
from flashdraft.models.target import Target
from flashdraft.train.data import Example, collate
from flashdraft.models.forward import target_pass
from flashdraft.train.objective import TrainError

FORMAT = "flashdraft-features"
VERSION = 1
MANIFEST = "features.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_IDENTITY = ("format", "version", "target", "layer_ids", "dtype", "with_final", "n_examples", "n_tokens", "data_hash",
             "shard_size")
_ARCH_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size", "hidden_act", "hidden_activation", "rms_norm_eps", "rope_theta",
              "rope_parameters", "rope_scaling", "rope_local_base_freq", "layer_types", "sliding_window",
              "query_pre_attn_scalar", "attn_logit_softcapping", "attention_bias", "tie_word_embeddings")


def shard_name(s: int) -> str:
    return f"shard-{s:05d}.safetensors"


def _sha(data: bytes | str, n: int = 16) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:n]


@torch.no_grad()
def target_fingerprint(target: Target) -> dict[str, Any]:
    """Sizes, a hash of the architecture config and a hash of the first values of every decoder
    weight (cast to bf16, so the same weights loaded in fp32 or bf16 agree)."""
    cfg = target.config.to_dict()
    arch = {k: cfg[k] for k in _ARCH_KEYS if k in cfg}
    h = hashlib.sha256()
    for name, p in target.model.get_decoder().named_parameters():
        head = p.detach().reshape(-1)[:64].to("cpu", torch.bfloat16)  # [<= 64]
        h.update(f"{name}{tuple(p.shape)}".encode())
        h.update(head.view(torch.int16).numpy().tobytes())
    return {
        "name": target.name, "num_layers": target.num_layers, "hidden_size": target.hidden_size,
        "vocab_size": target.vocab_size, "config_hash": _sha(json.dumps(arch, sort_keys=True, default=str)),
        "weights_hash": h.hexdigest()[:16],
    }


def examples_hash(examples: list[Example]) -> str:
    """Hash of every example's token ids and loss mask, in order (a cache built from other data differs)."""
    h = hashlib.sha256()
    for e in examples:
        h.update(np.int64(len(e.token_ids)).tobytes())
        h.update(np.asarray(e.token_ids, dtype=np.int64).tobytes())
        h.update(np.asarray(e.loss_mask, dtype=np.uint8).astype(bool).tobytes())
    return h.hexdigest()[:16]


def _key(manifest: dict) -> str:
    ident = {k: manifest[k] for k in _IDENTITY}
    ident["target"] = {k: v for k, v in ident["target"].items() if k != "name"}  # same model under another spec is fine
    return _sha(json.dumps(ident, sort_keys=True))


def _describe_target(t: dict) -> str:
    return (f"{t['name']} ({t['num_layers']} layers, hidden {t['hidden_size']}, vocab {t['vocab_size']}, "
            f"config {t['config_hash']}, weights {t['weights_hash']})")


def _describe_data(m: dict) -> str:
    src = m.get("source") or {}
    files = f" from {src['data']}" if src.get("data") else ""
    return f"{m['n_examples']} examples / {m['n_tokens']} tokens (hash {m['data_hash']}){files}"


def _same_target(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "name"} == {k: v for k, v in b.items() if k != "name"}


def _differences(old: dict, new: dict) -> list[str]:
    """What two manifests disagree on, each side named."""
    out = []
    if not _same_target(old["target"], new["target"]):
        out.append(f"target: cache {_describe_target(old['target'])} vs now {_describe_target(new['target'])}")
    if any(old.get(k) != new[k] for k in ("n_examples", "n_tokens", "data_hash")):
        out.append(f"data: cache {_describe_data(old)} vs now {_describe_data(new)}")
    out += [f"{k}: cache {old.get(k)} vs now {new[k]}" for k in ("layer_ids", "dtype", "with_final", "shard_size", "version")
            if old.get(k) != new[k]]
    return out


def build_manifest(
    target: Target, examples: list[Example], layer_ids: list[int], shard_size: int, dtype: str, with_final: bool,
    source: dict | None = None,
) -> dict[str, Any]:
    """The manifest of a cache of ``examples`` (fully determined before any shard is written)."""
    if dtype not in DTYPES:
        raise TrainError(f"feature dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    if shard_size < 1:
        raise TrainError(f"shard_size must be at least 1, got {shard_size}")
    if not examples:
        raise TrainError("no examples to compute features for; check the data files and max_len/block_size")
    if [e.index for e in examples] != list(range(len(examples))):
        raise TrainError("examples must be the list load_examples returns (Example.index == position in the list)")
    lens = [len(e.token_ids) for e in examples]
    shards = []
    for s, first in enumerate(range(0, len(examples), shard_size)):
        count = min(shard_size, len(examples) - first)
        shards.append({"file": shard_name(s), "first": first, "count": count, "tokens": sum(lens[first : first + count])})
    m = {
        "format": FORMAT, "version": VERSION, "target": target_fingerprint(target), "layer_ids": list(layer_ids),
        "dtype": dtype, "with_final": bool(with_final), "n_examples": len(examples), "n_tokens": sum(lens),
        "data_hash": examples_hash(examples), "shard_size": shard_size, "hidden_size": target.hidden_size,
        "compute_dtype": str(target.dtype).removeprefix("torch."), "source": source or {}, "shards": shards,
    }
    m["key"] = _key(m)
    return m


def _shard_ok(path: Path, key: str, s: int) -> bool:
    """True if ``path`` is a complete shard ``s`` of the cache ``key`` (header read only)."""
    if not path.is_file():
        return False
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception:  # noqa: BLE001 - unreadable or foreign file: rewrite it
        return False
    return meta.get("key") == key and meta.get("shard") == str(s)


def _save_shard(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Write through a hidden temp file in the same folder, fsync, rename: never a partial shard-*.safetensors."""
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


@torch.no_grad()
def _shard_tensors(target: Target, examples: list[Example], layer_ids: list[int], dtype: torch.dtype, with_final: bool,
                   on_example=None) -> dict[str, torch.Tensor]:
    lens = [len(e.token_ids) for e in examples]
    offsets = torch.tensor([0, *np.cumsum(lens).tolist()], dtype=torch.long)  # [n + 1]
    N, H = int(offsets[-1]), target.hidden_size
    feats = torch.empty(N, len(layer_ids) * H, dtype=dtype)  # [N, K*H]
    final = torch.empty(N, H, dtype=dtype) if with_final else None  # [N, H]
    for e, a, n in zip(examples, offsets.tolist(), lens):
        batch = collate([[e]], [0], device=target.device)
        f, h = target_pass(target, batch, layer_ids, with_final)  # [1, n, K*H], [1, n, H] | None
        feats[a : a + n] = f[0].to(dtype).cpu()
        if final is not None:
            final[a : a + n] = h[0].to(dtype).cpu()
        if on_example is not None:
            on_example()
    if dtype == torch.float16 and (feats.isinf().any() or (final is not None and final.isinf().any())):
        raise TrainError("target features overflow float16 (inf); store them as --dtype bfloat16 or float32")
    out = {
        "features": feats,
        "token_ids": torch.tensor([t for e in examples for t in e.token_ids], dtype=torch.long),  # [N]
        "loss_mask": torch.tensor([m for e in examples for m in e.loss_mask], dtype=torch.bool),  # [N]
        "offsets": offsets,
        "index": torch.tensor([e.index for e in examples], dtype=torch.long),  # [n]
    }
    if final is not None:
        out["final"] = final
    return out


def _clear(out: Path) -> None:
    for p in [*out.glob("shard-*.safetensors"), *out.glob(".shard-*.tmp"), out / MANIFEST]:
        p.unlink(missing_ok=True)


def _kept_shards(old: dict | None, new: dict, examples: list[Example]) -> list[int]:
    """Shards of the cache ``old`` that the cache ``new`` can keep as they are: those holding the same
    examples, when ``old`` was made for the same target/layers/dtype and its examples are the first ones
    of ``examples`` (data appended after them). [] when the old cache is anything else."""
    if not old or old.get("format") != FORMAT or old.get("key") == new["key"]:
        return []
    same = all(old.get(k) == new[k] for k in ("version", "layer_ids", "dtype", "with_final", "shard_size"))
    n_old = old.get("n_examples")
    if not (same and _same_target(old["target"], new["target"]) and isinstance(n_old, int) and n_old <= len(examples)):
        return []
    if examples_hash(examples[:n_old]) != old.get("data_hash"):
        return []
    return [s for s, sh in enumerate(old.get("shards", [])) if s < len(new["shards"]) and sh == new["shards"][s]]


def _retag(out: Path, kept: list[int], old_key: str, new_key: str) -> None:
    """Give the kept shards the new manifest key (each rewrite atomic; a shard already re-tagged by a killed
    earlier call is left as it is). Called before the new manifest is written, so a killed call repeats it."""
    for s in kept:
        path = out / shard_name(s)
        if _shard_ok(path, new_key, s) or not _shard_ok(path, old_key, s):
            continue  # done already, or missing/foreign: the main loop computes it
        _save_shard(path, load_file(str(path)), {"format": FORMAT, "key": new_key, "shard": str(s)})


def write_features(
    target: Target,
    examples: list[Example],
    layer_ids: list[int],
    out_dir: str | Path,
    shard_size: int = 256,
    dtype: str = "bfloat16",
    with_final: bool = False,
    progress: bool = True,
    overwrite: bool = False,
    source: dict | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> Path:
    """Compute and store the target features of ``examples``; resumable (complete shards are kept), and
    grown when ``examples`` extend the cached ones (their shards are kept, see the module docstring).

    ``source`` (e.g. data files, max_len, block_size) is recorded in the manifest for messages only.
    ``rank``/``world_size``: this process writes shards s with s % world_size == rank (several
    processes, e.g. one per GPU, can fill one folder; each writes the same manifest).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from flashdraft.models.target import check_target_layer_ids

    check_target_layer_ids(list(layer_ids), target.num_layers, target.name)
    if not 0 <= rank < world_size:
        raise TrainError(f"rank {rank} is outside 0..{world_size - 1} (world_size {world_size})")
    out = Path(out_dir)
    m = build_manifest(target, examples, layer_ids, shard_size, dtype, with_final, source)
    mpath = out / MANIFEST
    try:
        old = json.loads(mpath.read_text()) if mpath.is_file() else None
    except json.JSONDecodeError:
        old = {}  # not ours: refused below unless --overwrite or no shards
    if old is not None and old.get("key") != m["key"] and not with_final and old.get("with_final") and not overwrite:
        wider = build_manifest(target, examples, layer_ids, shard_size, dtype, True, source)
        if old.get("key") == wider["key"]:
            m = wider  # a cache that also holds the final hidden states serves a request without them
    kept = [] if overwrite else _kept_shards(old, m, examples)
    if kept:
        _retag(out, kept, old["key"], m["key"])
    elif old is not None and old.get("key") != m["key"]:
        if overwrite:
            _clear(out)
        elif any(out.glob("shard-*.safetensors")):
            diff = "; ".join(_differences(old, m)) if old.get("format") == FORMAT else f"{mpath} is not a {FORMAT} manifest"
            raise TrainError(
                f"feature folder {out} already holds a cache made for something else ({diff}); pass --overwrite to "
                "replace it or choose a new --out folder"
            )
    elif old is None and overwrite:
        _clear(out)
    make_output_dir(out)
    if old is None or old.get("key") != m["key"]:
        atomic_write_text(mpath, json.dumps(m, indent=1) + "\n")
    store_dtype = DTYPES[dtype]
    mine = [s for s in range(len(m["shards"])) if s % world_size == rank]
    total = sum(m["shards"][s]["count"] for s in mine)
    cols = (TextColumn("features"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*cols, disable=not progress) as bar:
        task = bar.add_task("features", total=total)
        for s in mine:
            sh = m["shards"][s]
            path = out / sh["file"]
            if _shard_ok(path, m["key"], s):
                bar.advance(task, sh["count"])
                continue
            for stale in out.glob(f".{sh['file']}.*.tmp"):  # left by a killed writer of this shard
                stale.unlink(missing_ok=True)
            exs = examples[sh["first"] : sh["first"] + sh["count"]]
            tensors = _shard_tensors(target, exs, list(layer_ids), store_dtype, with_final, lambda: bar.advance(task))
            _save_shard(path, tensors, {"format": FORMAT, "key": m["key"], "shard": str(s)})
    return out


class FeatureStore:
    """Read a feature cache: check it fits the run, then fetch one example's rows lazily."""

    def __init__(self, path: str | Path, max_open: int = 64):
        self.path = Path(path)
        mpath = self.path / MANIFEST
        if not mpath.is_file():
            raise TrainError(f"no feature cache at {self.path} ({MANIFEST} missing); build it with `flashdraft features`")
        self.manifest: dict[str, Any] = json.loads(mpath.read_text())
        if self.manifest.get("format") != FORMAT or self.manifest.get("version") != VERSION:
            raise TrainError(
                f"{mpath} is not a {FORMAT} v{VERSION} manifest; rebuild the cache with this version of `flashdraft features`"
            )
        self.max_open = max_open
        self._open: OrderedDict[int, tuple[Any, list[int], list[int]]] = OrderedDict()  # shard -> (handle, offsets, index)

    # -- manifest facts --------------------------------------------------------------------------
    @property
    def layer_ids(self) -> list[int]:
        return list(self.manifest["layer_ids"])

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.manifest["dtype"]]

    @property
    def with_final(self) -> bool:
        return bool(self.manifest["with_final"])

    @property
    def n_examples(self) -> int:
        return int(self.manifest["n_examples"])

    @property
    def n_tokens(self) -> int:
        return int(self.manifest["n_tokens"])

    @property
    def hidden_size(self) -> int:
        return int(self.manifest["hidden_size"])

    @property
    def shard_files(self) -> list[Path]:
        return [self.path / s["file"] for s in self.manifest["shards"]]

    def missing_shards(self) -> list[int]:
        return [s for s, p in enumerate(self.shard_files) if not _shard_ok(p, self.manifest["key"], s)]

    # -- checks ----------------------------------------------------------------------------------
    def check(self, target: Target, layer_ids: list[int], examples: list[Example] | None = None,
              need_final: bool = False) -> None:
        """Raise :class:`TrainError` unless this cache was made for ``target``, holds ``layer_ids``,
        (with ``examples``) was built from the same data, holds final states if needed, and is complete."""
        m, where = self.manifest, f"feature cache {self.path}"
        fp = target_fingerprint(target)
        if not _same_target(m["target"], fp):
            raise TrainError(
                f"{where} was made for target {_describe_target(m['target'])}, but the target now is "
                f"{_describe_target(fp)}; rebuild it for this target (`flashdraft features --target ...` into a new "
                "folder or with --overwrite) or pass the cache made for it"
            )
        absent = [i for i in layer_ids if i not in m["layer_ids"]]
        if absent:
            raise TrainError(
                f"{where} holds target layers {m['layer_ids']}, but the drafter reads {list(layer_ids)} ({absent} not "
                f"cached); rebuild it with `flashdraft features --layer-ids {','.join(map(str, layer_ids))}` (new folder "
                "or --overwrite) or train a drafter on the cached layers"
            )
        if examples is not None:
            now = {"n_examples": len(examples), "n_tokens": sum(len(e.token_ids) for e in examples),
                   "data_hash": examples_hash(examples)}
            if (now["data_hash"], now["n_examples"]) != (m["data_hash"], m["n_examples"]):
                raise TrainError(
                    f"{where} was built from {_describe_data(m)}, but the training data gives {_describe_data(now)}; "
                    "use the same data files and max_len/block_size, or rebuild the cache from this data"
                )
        if need_final and not self.with_final:
            raise TrainError(
                f"{where} has no final hidden states (built without --with-final), which loss 'kl' needs; rebuild it "
                "with `flashdraft features --with-final` or train with loss 'ce'"
            )
        missing = self.missing_shards()
        if missing:
            names = ", ".join(self.manifest["shards"][s]["file"] for s in missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise TrainError(
                f"{where} is incomplete: {len(missing)} of {len(self.shard_files)} shards missing ({names}); rerun "
                "`flashdraft features` with the same arguments to finish it"
            )

    def layer_columns(self, layer_ids: list[int] | None = None) -> slice | torch.Tensor:
        """Columns of the stored [N, K*H] features that hold ``layer_ids`` in that order: a slice when
        they are a contiguous run of the cached ids, else a long index tensor."""
        cached, H = self.layer_ids, self.hidden_size
        ids = cached if layer_ids is None else list(layer_ids)
        absent = [i for i in ids if i not in cached]
        if absent:
            raise TrainError(f"feature cache {self.path} holds target layers {cached}, not {absent} (asked for {ids})")
        pos = [cached.index(i) for i in ids]
        if pos == list(range(pos[0], pos[0] + len(pos))):
            return slice(pos[0] * H, (pos[-1] + 1) * H)
        return torch.cat([torch.arange(p * H, (p + 1) * H) for p in pos])  # [len(ids) * H]

    # -- reads -----------------------------------------------------------------------------------
    def _shard(self, s: int):
        if s in self._open:
            self._open.move_to_end(s)
            return self._open[s]
        path = self.shard_files[s]
        if not _shard_ok(path, self.manifest["key"], s):
            raise TrainError(
                f"feature cache {self.path}: {path.name} is missing or belongs to another cache; rerun "
                "`flashdraft features` with the same arguments to finish it"
            )
        f = safe_open(str(path), framework="pt")
        entry = (f, f.get_tensor("offsets").tolist(), f.get_tensor("index").tolist())
        self._open[s] = entry
        while len(self._open) > self.max_open:
            self._open.popitem(last=False)
        return entry

    def get(self, index: int, layer_ids: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows of example ``index`` (:attr:`Example.index`) -> (features [n, K*H] in the stored dtype,
        columns of ``layer_ids`` if given; final [n, H] or None). Only those rows are read."""
        if not 0 <= index < self.n_examples:
            raise TrainError(f"example {index} is outside feature cache {self.path} (0..{self.n_examples - 1})")
        s, j = divmod(index, int(self.manifest["shard_size"]))
        f, offsets, idx = self._shard(s)
        assert idx[j] == index, f"{self.path}: shard {s} row {j} holds example {idx[j]}, not {index}"
        a, b = offsets[j], offsets[j + 1]
        cols = self.layer_columns(layer_ids) if layer_ids is not None else slice(None)
        sl = f.get_slice("features")
        if isinstance(cols, slice):
            feats = sl[a:b, cols] if cols != slice(None) else sl[a:b]  # [n, K'*H]
        else:
            feats = sl[a:b].index_select(1, cols)  # [n, K'*H]
        final = f.get_slice("final")[a:b] if self.with_final else None  # [n, H]
        return feats, final

    def collate(self, rows: list[list[Example]], layer_ids: list[int] | None = None, device: torch.device | str = "cpu",
                want_final: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Features laid out like :func:`~flashdraft.train.data.collate` lays out tokens: rows of
        (packed) examples, right-padded with zeros -> (features [b, T, K*H], final [b, T, H] | None)."""
        T = max(sum(len(e.token_ids) for e in row) for row in rows)
        K = len(layer_ids) if layer_ids is not None else len(self.layer_ids)
        H = self.hidden_size
        if want_final and not self.with_final:
            raise TrainError(f"feature cache {self.path} has no final hidden states; rebuild it with --with-final")
        feats = torch.zeros(len(rows), T, K * H, dtype=self.dtype)  # [b, T, K*H]
        final = torch.zeros(len(rows), T, H, dtype=self.dtype) if want_final else None  # [b, T, H]
        for r, row in enumerate(rows):
            s = 0
            for e in row:
                f, h = self.get(e.index, layer_ids)
                n = len(e.token_ids)
                if f.shape[0] != n:
                    raise TrainError(
                        f"feature cache {self.path} has {f.shape[0]} rows for example {e.index}, the data {n} tokens; "
                        "the cache was built from other data (FeatureStore.check with the examples tells which)"
                    )
                feats[r, s : s + n] = f
                if final is not None:
                    final[r, s : s + n] = h
                s += n
        return feats.to(device), (final.to(device) if final is not None else None)
