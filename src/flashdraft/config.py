"""The typed config schema shared by every command.

Each pipeline stage declares its section as a :class:`Section` subclass in its own package; a
command reads it from YAML (``--config run.yaml``), then ``--set key=value`` pairs (any field, the
value read as YAML), then its own flags, each overriding the one before. The same field names appear
in the YAML, in ``--set``, in the flags and in the config saved next to outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from flashdraft.errors import FlashdraftError, warn

S = TypeVar("S", bound="Section")


class ConfigError(FlashdraftError, ValueError):
    """A config file or flag that cannot be used; the message says which field and why."""


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @classmethod
    def section_name(cls) -> str:
        """``TrainConfig`` -> ``train``: how messages name the section."""
        return cls.__name__.removesuffix("Config").lower()

    @classmethod
    def load(cls: type[S], path: str | Path | None = None, sets: list[str] | None = None, **overrides: Any) -> S:
        """Read ``path`` (YAML) if given, then the ``--set key=value`` pairs in ``sets``, then ``overrides``
        whose value is not None; pydantic validates the result (types, bounds, unknown keys)."""
        data = dict(read_yaml(path))
        from_sets = parse_sets(sets, cls)
        flags = {k: v for k, v in overrides.items() if v is not None}
        for k in sorted(k for k in from_sets if k in flags and from_sets[k] != flags[k]):
            warn(f"--set {k}={from_sets[k]} is overridden by its flag ({flags[k]!r}); drop one of the two")
        data.update(from_sets)
        data.update(flags)
        try:
            return cls(**data)
        except ValidationError as e:
            raise ConfigError(validation_message(e, f"invalid {cls.section_name()} config")) from None

    def save(self, path: str | Path) -> None:
        """Write the config as YAML (atomically: temp file + rename)."""
        from flashdraft.io import atomic_write_text

        atomic_write_text(Path(path), yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False))


def validation_message(e: ValidationError, what: str) -> str:
    """A pydantic error on one line: each wrong field, what is wrong and the value found; missing fields with how
    to give them."""
    missing = [".".join(map(str, err["loc"])) for err in e.errors() if err["type"] == "missing"]
    wrong = []
    for err in e.errors():
        if err["type"] == "missing":
            continue
        field = ".".join(map(str, err["loc"])) or "(config)"
        found = err.get("input")
        got = f" (found {found!r})" if found is not None and not isinstance(found, (dict, list)) else ""
        wrong.append(f"{field}: {err['msg']}{got}")
    parts = wrong + ([f"missing {', '.join(missing)}: pass the flag or set it in the --config YAML (or --set "
                      f"{missing[0]}=...)"] if missing else [])
    return f"{what}: " + "; ".join(parts)


def read_yaml(path: str | Path | None) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` ({} for None), as :meth:`Section.load` reads it."""
    if path is None:
        return {}
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config {p} is a folder; pass a YAML file (e.g. {p / 'config.yaml'}) or drop --config")
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist; pass an existing YAML file or drop --config")
    loaded = load_yaml_file(p) or {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {p} must hold a mapping of field: value, found {type(loaded).__name__}")
    return loaded


def load_yaml_file(path: str | Path) -> Any:
    """The YAML document in ``path``; a file that does not parse is a :class:`ConfigError` naming its line."""
    p = Path(path)
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{p} is not valid YAML{where}: {what}; fix the file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p} is not a UTF-8 text file; pass a YAML file") from None


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


def parse_sets(items: list[str] | None, schema: type[Section]) -> dict[str, Any]:
    """``--set key=value`` pairs -> field overrides of ``schema`` (values parsed as YAML: ``4``, ``[1, 3]``,
    ``null``); a key that is not a field is a :class:`ConfigError` listing the fields."""
    items = [k.strip().replace("-", "_") + eq + v for k, eq, v in (i.partition("=") for i in items or [])]
    out = sets_to_dict(items)
    known = [f.alias or name for name, f in schema.model_fields.items()]
    for key in out:
        if key not in known and key not in schema.model_fields:
            raise ConfigError(f"--set {key}: no such {schema.section_name()} config field; known: {', '.join(known)}")
    return out
