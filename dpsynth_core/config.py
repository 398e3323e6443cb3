"""Typed configs: pydantic models loaded from YAML with errors that name the file and field."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from dpsynth_core.errors import ConfigError

C = TypeVar("C", bound=BaseModel)


class StrictConfig(BaseModel):
    """Base for every config: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())


def load_config(path: str | Path, cls: type[C]) -> C:
    """Load ``path`` (YAML or JSON) into ``cls``; raise ConfigError naming file and field."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {format_validation_error(exc)}") from None


def format_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        parts.append(f"field '{loc}': {err['msg']}")
    return "; ".join(parts)
