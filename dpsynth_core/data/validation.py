"""Check a raw DataFrame against a column mapping; convert declared columns to their types.

Each check raises a DataError naming the file, the column and the first offending 1-based
data row, with the count of offending rows. Values are never put into messages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from dpsynth_core.data.errors import data_error

ColumnType = Literal["categorical", "numeric"]
COLUMN_TYPES = ("categorical", "numeric")
ColumnsSpec = Sequence[str] | Mapping[str, str] | None


def normalize_columns(columns: ColumnsSpec, path: str | Path = "<columns>") -> dict[str, str | None]:
    """Turn ``columns`` (list of names, or mapping name -> type) into ``{name: type or None}``."""
    if columns is None:
        return {}
    if isinstance(columns, str):
        columns = [columns]
    if isinstance(columns, Mapping):
        out: dict[str, str | None] = {}
        for name, kind in columns.items():
            if kind not in COLUMN_TYPES:
                raise data_error(
                    path, f"unknown column type {kind!r}", column=str(name),
                    hint=f"Expected one of {', '.join(COLUMN_TYPES)}",
                )
            out[str(name)] = kind
        return out
    return {str(name): None for name in columns}


def require_columns(frame: pd.DataFrame, path: Path, wanted: Sequence[str]) -> None:
    """Raise if any column in ``wanted`` is absent, listing the available ones."""
    available = [str(c) for c in frame.columns]
    for name in wanted:
        if name not in available:
            raise data_error(
                path, "column not found", column=name,
                hint=f"Available columns: {', '.join(available) if available else '(none)'}",
            )


def _first_bad(mask: pd.Series) -> int:
    """1-based position of the first True in ``mask``."""
    return int(mask.to_numpy(dtype=bool).argmax()) + 1


def _raise_at(path: Path, column: str, mask: pd.Series, problem: str, hint: str | None = None) -> None:
    # The first bad row only: how many rows are bad is a statistic of the private data.
    if mask.any():
        raise data_error(path, problem, column=column, row=_first_bad(mask), hint=hint)


def _is_missing(value) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return value is pd.NA or value is pd.NaT


def check_text(frame: pd.DataFrame, path: Path, column: str, max_chars: int | None) -> pd.Series:
    """Text must be a non-empty string (not NaN, not whitespace only) of at most ``max_chars``."""
    col = frame[column]
    missing = col.map(_is_missing)
    _raise_at(path, column, missing, "missing text (NaN, null or empty cell)", "Every record needs text")
    not_str = col.map(lambda v: not isinstance(v, str))
    _raise_at(path, column, not_str, "expected text (a string), found a non-string value")
    blank = col.map(lambda v: not v.strip())
    _raise_at(path, column, blank, "empty or whitespace-only text", "Every record needs non-empty text")
    if max_chars is not None:
        too_long = col.map(lambda v: len(v) > max_chars)
        _raise_at(
            path, column, too_long, f"text longer than the limit of max_chars={max_chars} characters",
            "Shorten or drop the record, or raise max_chars",
        )
    return col.astype(object)


def check_key(frame: pd.DataFrame, path: Path, column: str, what: str) -> pd.Series:
    """Labels and user ids: present on every row; returned as strings (1.0 -> "1" for integral floats)."""
    col = frame[column]
    missing = col.map(_is_missing)
    _raise_at(path, column, missing, f"missing {what} (NaN, null or empty cell)", f"Every record needs a {what}")
    return col.map(_as_key).astype(object)


def _as_key(value) -> str:
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value).strip() if isinstance(value, str) else str(value)


def check_numeric(frame: pd.DataFrame, path: Path, column: str) -> pd.Series:
    """A numeric column must parse as finite-or-NaN-free numbers on every row."""
    col = frame[column]
    missing = col.map(_is_missing)
    _raise_at(path, column, missing, "missing value in a numeric column (NaN, null or empty cell)")
    if pd.api.types.is_bool_dtype(col):
        return col.astype(int)
    if pd.api.types.is_numeric_dtype(col):
        return col
    parsed = pd.to_numeric(col.map(lambda v: v.strip() if isinstance(v, str) else v), errors="coerce")
    _raise_at(path, column, parsed.isna(), "expected a number, found a non-numeric value")
    if (parsed == parsed.round()).all() and parsed.abs().max() < 2**53:
        return parsed.astype("int64")
    return parsed.astype("float64")


def check_categorical(frame: pd.DataFrame, path: Path, column: str) -> pd.Series:
    """A categorical column: present on every row, values as strings."""
    return check_key(frame, path, column, "value")


def infer_numeric(col: pd.Series) -> pd.Series:
    """Undeclared CSV columns arrive as strings: turn them into numbers when every cell parses."""
    if col.dtype != object:
        return col
    values = col.dropna()
    if values.empty or not values.map(lambda v: isinstance(v, str)).all():
        return col
    parsed = pd.to_numeric(values.str.strip(), errors="coerce")
    if parsed.isna().any():
        return col
    return pd.to_numeric(col.map(lambda v: v.strip() if isinstance(v, str) else v))
