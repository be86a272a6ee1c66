"""The typed config schema shared by every command.

Each pipeline stage declares its section as a :class:`Section` subclass in its own package; a
command reads it from YAML (``--config run.yaml``) and command-line flags override single fields;
:func:`load_with_sets` also takes ``--set key=value`` items between the two.
The same field names appear in the YAML, in the flags and in the config saved next to outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

S = TypeVar("S", bound="Section")


class ConfigError(ValueError):
    """A config file or flag that cannot be used; the message says which field and why."""


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @classmethod
    def load(cls: type[S], path: str | Path | None = None, **overrides: Any) -> S:
        """Read ``path`` (YAML) if given, then apply ``overrides`` whose value is not None."""
        data: dict[str, Any] = {}
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise ConfigError(f"config file {p} does not exist; pass an existing YAML file or drop --config")
            loaded = yaml.safe_load(p.read_text()) or {}
            if not isinstance(loaded, dict):
                raise ConfigError(f"config file {p} must hold a mapping of field: value, found {type(loaded).__name__}")
            data.update(loaded)
        data.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls(**data)
        except ValidationError as e:
            raise ConfigError(f"invalid {cls.__name__} config:\n{e}") from None

    def save(self, path: str | Path) -> None:
        """Write the config as YAML (atomically: temp file + rename)."""
        from flashdraft.io import atomic_write_text

        atomic_write_text(Path(path), yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False))


def read_yaml(path: str | Path | None) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` ({} for None), as :meth:`Section.load` reads it."""
    if path is None:
        return {}
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist; pass an existing YAML file or drop --config")
    loaded = yaml.safe_load(p.read_text()) or {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {p} must hold a mapping of field: value, found {type(loaded).__name__}")
    return loaded


def sets_to_dict(sets: list[str] | None) -> dict[str, Any]:
    """``["key=value", "a.b=1"]`` -> {"key": value, "a": {"b": 1}}; values are read as YAML scalars/lists."""
    out: dict[str, Any] = {}
    for item in sets or []:
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--set {item!r} is not key=value; write e.g. --set temperature=0.7")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML ({e})") from None
        node = out
        *parents, leaf = key.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {part} is set both as a value and as a section")
        node[leaf] = value
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_with_sets(cls: type[S], path: str | Path | None, sets: list[str] | None, **overrides: Any) -> S:
    """``cls`` from the YAML ``path``, then ``--set key=value`` items, then ``overrides`` (flags; None = unset)."""
    data = _merge(read_yaml(path), sets_to_dict(sets))
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return cls(**data)
    except ValidationError as e:
        raise ConfigError(f"invalid {cls.__name__} config:\n{e}") from None
