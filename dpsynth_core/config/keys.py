"""One name per config key across pipelines; the old spellings are accepted for one release.

The shared names: ``output_dir`` (the run directory; was ``run_dir`` in ACTG, WASP, Aug-PE),
``data.path`` (your data file), ``data.text_col`` / ``data.label_col`` / ``data.user_col`` (its
columns; ``dpsynth train`` and ``audit`` said ``text_column`` / ``user_column``; ``user_col`` only where
a method bounds a user's contribution: ``config/record_level.py``), ``data.n_records`` (the public
working-set size m; PE said ``num_private``, DPFairLLM and AIM ``train_rows``), ``adapter_dir`` (a LoRA
adapter's directory; Serve said ``adapter``), ``dtype: auto|float32|bfloat16`` (``bf16``/``fp32`` accepted,
``config/placement.py: Dtype``).

A renamed field keeps its Python name and takes the new key as its alias
(``run_dir: Path = Field(..., alias="output_dir")``; StrictConfig accepts both). A key moved to
another place (PE's and the tabular runs' top-level ``epsilon`` / ``delta`` -> ``privacy.epsilon`` /
``privacy.delta``; ``dpsynth train``'s ``train.epsilon`` -> ``privacy.epsilon``) is listed in the
class's ``moved_keys`` and moved by :func:`move_keys` before validation; a run made before the move is
refused in one line naming ``--fresh`` (``runs.run_dir.refuse_changed_config``). :func:`check_renamed_keys`, called by ``load_config``, prints one line per old spelling or
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
        if _has(raw, old):
            if _has(raw, new):
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


def _has(raw, dotted: str) -> bool:
    *parents, leaf = dotted.split(".")
    for key in parents:
        raw = raw.get(key) if isinstance(raw, dict) else None
    return isinstance(raw, dict) and leaf in raw


def _get(raw, dotted: str):
    for key in dotted.split("."):
        raw = raw[key]
    return raw


def move_keys(values, moves: dict[str, str]):
    """Before validation: each old key of ``moves`` (dotted: ``"train.epsilon"``) to its new place
    (``"privacy.epsilon"``); the sections on the way are copied, never the caller's mapping changed."""
    if not isinstance(values, dict) or not any(_has(values, old) for old in moves):
        return values
    values = dict(values)
    moved_here: dict[str, bool] = {}  # new keys this call filled from an old place
    for old, new in moves.items():
        if not _has(values, old):
            continue
        *old_parents, old_leaf = old.split(".")
        node = values
        for key in old_parents:
            node[key] = dict(node[key])
            node = node[key]
        value = node.pop(old_leaf)
        if _has(values, new):
            if moved_here.get(new):  # two old places of one key (DPFairLLM's training.device, generation.device)
                if value == _get(values, new):
                    continue
                raise ValueError(f"'{old}' differs from another old place of '{new}': give '{new}' only")
            raise ValueError(f"give '{new}' only ('{old}' is its old place)")
        moved_here[new] = True
        *new_parents, new_leaf = new.split(".")
        node = values
        for key in new_parents:
            node[key] = dict(node.get(key) or {})
            node = node[key]
        node[new_leaf] = value
    return values
