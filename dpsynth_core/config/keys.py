"""One name per config key across pipelines; the old spellings are accepted for one release.

The shared names: ``output_dir`` (the run directory; was ``run_dir`` in ACTG, WASP, Aug-PE),
``data.path`` (your data file), ``data.text_col`` / ``data.label_col`` / ``data.user_col`` (its
columns; ``dpsynth train`` and ``audit`` said ``text_column`` / ``user_column``).

A renamed field keeps its Python name and takes the new key as its alias
(``run_dir: Path = Field(..., alias="output_dir")``; StrictConfig accepts both). :func:`check_renamed_keys`,
called by ``load_config``, prints one line per old spelling found in a config file, naming the new key.
"""

from __future__ import annotations

import sys
from typing import get_args

from pydantic import BaseModel

from dpsynth_core.errors import ConfigError


def _model_types(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [t for arg in get_args(annotation) for t in _model_types(arg)]


def renamed_keys(raw: dict, cls: type[BaseModel], prefix: str = "") -> list[tuple[str, str]]:
    """(old dotted key, new dotted key) for each old spelling used in ``raw`` (a config mapping)."""
    found: list[tuple[str, str]] = []
    for name, field in cls.model_fields.items():
        new = field.alias or name
        if new != name and name in raw:
            if new in raw:
                raise ConfigError(f"give '{prefix}{new}' only ('{prefix}{name}' is its old name)")
            found.append((f"{prefix}{name}", f"{prefix}{new}"))
        value = raw.get(new, raw.get(name))
        if isinstance(value, dict):
            for sub in _model_types(field.annotation):
                found += renamed_keys(value, sub, f"{prefix}{new}.")
    return found


def check_renamed_keys(raw: dict, cls: type[BaseModel], source: str) -> None:
    """Print one line per deprecated key of ``raw`` (stderr): the new name to use."""
    try:
        found = renamed_keys(raw, cls)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    for old, new in found:
        print(f"{source}: key '{old}' is now '{new}'; the old name is accepted until the next release",
              file=sys.stderr)
