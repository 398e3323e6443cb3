"""One name per config key across pipelines; the old spellings are accepted for one release.

The shared names: ``output_dir`` (the run directory; was ``run_dir`` in ACTG, WASP, Aug-PE),
``data.path`` (your data file), ``data.text_col`` / ``data.label_col`` / ``data.user_col`` (its
columns; ``dpsynth train`` and ``audit`` said ``text_column`` / ``user_column``; ``user_col`` only where
a method bounds a user's contribution: ``config/record_level.py``), ``data.n_records`` (the public
working-set size m; PE said ``num_private``, DPFairLLM and AIM ``train_rows``), ``adapter_dir`` (a LoRA
adapter's directory; Serve said ``adapter``), ``dtype: auto|float32|bfloat16`` (``bf16``/``fp32`` accepted,
``config/placement.py: Dtype``).

A renamed field keeps its Python name and takes the new key as its alias
(``run_dir: Path = Field(..., alias="output_dir")``; StrictConfig accepts both). A key moved into a
section (PE's and the tabular runs' top-level ``epsilon`` / ``delta`` -> ``privacy.epsilon`` /
``privacy.delta``) is listed in the class's ``moved_keys`` and moved by :func:`move_keys` before
validation. :func:`check_renamed_keys`, called by ``load_config``, prints one line per old spelling or
place found in a config file, naming the new key.
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
    for old, new in getattr(cls, "moved_keys", {}).items():
        if old in raw:
            section, _, key = new.partition(".")
            if isinstance(raw.get(section), dict) and key in raw[section]:
                raise ConfigError(f"give '{prefix}{new}' only ('{prefix}{old}' is its old place)")
            found.append((f"{prefix}{old}", f"{prefix}{new}"))
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


def move_keys(values, moves: dict[str, str]):
    """Before validation: each old top-level key of ``moves`` into its section (``"epsilon": "privacy.epsilon"``)."""
    if not isinstance(values, dict) or not any(old in values for old in moves):
        return values
    values = dict(values)
    for old, new in moves.items():
        if old in values:
            section, _, key = new.partition(".")
            inner = dict(values.get(section) or {})
            if key in inner:
                raise ValueError(f"give '{new}' only ('{old}' is its old place)")
            inner[key] = values.pop(old)
            values[section] = inner
    return values
