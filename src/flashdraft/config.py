"""The typed config schema shared by every command.

Each pipeline stage declares its section as a :class:`Section` subclass in its own package; a
command reads it from YAML (``--config run.yaml``) and command-line flags override single fields.
The same field names appear in the YAML, in the flags and in the config saved next to outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from flashdraft.errors import FlashdraftError

S = TypeVar("S", bound="Section")


class ConfigError(FlashdraftError, ValueError):
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
