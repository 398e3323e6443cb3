"""Load a user's private data file (CSV, JSONL, Parquet) with a column mapping, validated."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

# by full name: `from dpsynth_core.data import validation` would go through data/__init__, which imports this
import dpsynth_core.data.validation as validation
from dpsynth_core.data.errors import data_error
from dpsynth_core.data.readers import read_frame

DEFAULT_MAX_CHARS = 20000


@dataclass(frozen=True)
class TextDataset:
    """Private text records flowing into a pipeline. ``labels``/``user_ids`` are None when unmapped."""

    texts: list[str]
    labels: list[str] | None
    user_ids: list[str] | None
    source: str

    def __len__(self) -> int:
        return len(self.texts)

    def __repr__(self) -> str:  # never show private texts in a repr that may reach a log
        return (
            f"TextDataset(source={self.source!r}, n={len(self.texts)}, "
            f"labels={'yes' if self.labels is not None else 'no'}, "
            f"user_ids={'yes' if self.user_ids is not None else 'no'})"
        )


def load_records(
    path: str | Path,
    *,
    text_col: str | None = None,
    label_col: str | None = None,
    user_col: str | None = None,
    columns: Sequence[str] | Mapping[str, str] | None = None,
    max_chars: int | None = DEFAULT_MAX_CHARS,
) -> pd.DataFrame:
    """Read and validate a CSV / JSONL / Parquet file (chosen by extension).

    Args:
        path: the data file.
        text_col: column of free text; must be a non-empty string of at most ``max_chars``.
        label_col: class label; must be present on every row; returned as strings.
        user_col: user id for user-level privacy; must be present on every row; strings.
        columns: tabular columns, either a list of names or ``{name: "categorical"|"numeric"}``.
            Numeric columns must parse as numbers on every row; categorical ones are strings.
        max_chars: length limit for ``text_col`` (None: no limit).

    Returns:
        A DataFrame. When ``columns`` is given, only the mapped columns (text, label, user,
        then ``columns``) are kept; otherwise all columns. Undeclared CSV columns whose every
        cell is a number are converted to numbers.

    Raises:
        DataError: naming file, column and 1-based data row; never the value itself.
    """
    path = Path(path)
    col_types = validation.normalize_columns(columns, path)
    roles = [c for c in (text_col, label_col, user_col) if c is not None]
    wanted = list(dict.fromkeys(roles + list(col_types)))
    if max_chars is not None and max_chars < 1:
        raise data_error(path, f"max_chars must be a positive integer, got {max_chars}")

    frame = read_frame(path)
    frame.columns = [str(c) for c in frame.columns]
    if len(frame) == 0:
        raise data_error(path, "no data rows (0 rows)", hint="The file has a header but no records")
    validation.require_columns(frame, path, wanted)

    out = frame[wanted].copy() if col_types else frame.copy()
    for name in out.columns:
        if name == text_col:
            out[name] = validation.check_text(frame, path, name, max_chars)
        elif name in (label_col, user_col):
            what = "label" if name == label_col else "user id"
            out[name] = validation.check_key(frame, path, name, what)
        elif col_types.get(name) == "numeric":
            out[name] = validation.check_numeric(frame, path, name)
        elif col_types.get(name) == "categorical":
            out[name] = validation.check_categorical(frame, path, name)
        else:
            out[name] = validation.infer_numeric(out[name])
    return out.reset_index(drop=True)


def load_text_dataset(
    path: str | Path,
    text_col: str,
    label_col: str | None = None,
    user_col: str | None = None,
    max_chars: int | None = DEFAULT_MAX_CHARS,
) -> TextDataset:
    """Load a validated text dataset (see :func:`load_records` for the checks)."""
    frame = load_records(
        path, text_col=text_col, label_col=label_col, user_col=user_col,
        columns=None, max_chars=max_chars,
    )
    return TextDataset(
        texts=[str(t) for t in frame[text_col]],
        labels=[str(v) for v in frame[label_col]] if label_col else None,
        user_ids=[str(v) for v in frame[user_col]] if user_col else None,
        source=str(path),
    )
