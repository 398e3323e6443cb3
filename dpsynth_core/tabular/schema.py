"""Public table schema: column types, bounds, category lists, sensitive attributes, target.

The schema is *public* knowledge (e.g. the UCI documentation ``adult.names``); nothing in it may
be read off the private data for free. A column may instead say ``domain: dp`` and give a public
*candidate* domain; :mod:`dpsynth_core.tabular.dp_domain` then estimates bounds / categories
under DP with the cost recorded in the run's ledger.

Values outside a DP-estimated category list are expected (the estimate drops rare candidates and
does not know values outside the candidates); the schema's ``unknown`` says what happens to them
in the private table: ``other`` (default) maps them to the category ``other_label`` ("Other"),
which :meth:`TableSchema.with_other_buckets` adds to every DP-estimated list (post-processing,
free); ``drop`` drops their rows. Values outside a *public* category list are an error found by
:meth:`TableSchema.preflight` on the whole file, before any budget is spent.

    schema = load_schema("configs/schemas/adult.yaml").select(["age", "sex", "income"])
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from dpsynth_core.config import StrictConfig, load_config
from dpsynth_core.errors import ConfigError, DataError

# Characters a category may not contain: they would make the `<col>: value` text ambiguous.
FORBIDDEN_IN_CATEGORY = (",", "\n", ":")


def _grid(lo: float, hi: float, decimals: int) -> tuple[int, int]:
    scale = 10**decimals
    return math.ceil(round(lo * scale, 6)), math.floor(round(hi * scale, 6))


class ColumnSpec(StrictConfig):
    """One column. ``categorical`` needs ``categories``; ``numeric``/``integer`` need ``min``/``max``
    unless ``domain: dp`` (then ``candidate_min``/``candidate_max`` bound the DP search)."""

    name: str
    type: Literal["categorical", "numeric", "integer"]
    categories: list[str] | None = None
    min: float | None = None
    max: float | None = None
    precision: int = Field(0, ge=0, le=6, description="decimals kept for numeric columns")
    domain: Literal["public", "dp"] = "public"
    candidate_min: float | None = None
    candidate_max: float | None = None
    candidate_categories: list[str] | None = None
    description: str = ""

    @model_validator(mode="after")
    def _check(self) -> ColumnSpec:
        where = f"column '{self.name}'"
        if self.type == "categorical":
            cats = self.categories if self.domain == "public" else self.candidate_categories
            key = "categories" if self.domain == "public" else "candidate_categories"
            if cats is None:
                raise ValueError(f"{where}: categorical column needs '{key}'")
            if len(cats) == 0:
                raise ValueError(f"{where}: empty category list ('{key}')")
            if len(set(cats)) != len(cats):
                raise ValueError(f"{where}: duplicate categories in '{key}'")
            for c in cats:
                if not c or c != c.strip() or any(ch in c for ch in FORBIDDEN_IN_CATEGORY):
                    raise ValueError(
                        f"{where}: category #{cats.index(c)} is empty, padded with spaces or contains one of "
                        f"{FORBIDDEN_IN_CATEGORY!r}"
                    )
        else:
            lo_key, hi_key = ("min", "max") if self.domain == "public" else ("candidate_min", "candidate_max")
            lo, hi = getattr(self, lo_key), getattr(self, hi_key)
            if lo is None or hi is None:
                raise ValueError(f"{where}: {self.type} column needs '{lo_key}' and '{hi_key}'")
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise ValueError(f"{where}: '{lo_key}'/'{hi_key}' must be finite")
            if lo > hi:
                raise ValueError(f"{where}: {lo_key} > {hi_key} ({lo} > {hi})")
            if self.type == "integer" and self.precision != 0:
                raise ValueError(f"{where}: integer column cannot have precision {self.precision}")
            if self.domain == "public":
                g_lo, g_hi = _grid(lo, hi, self.decimals)
                if g_lo > g_hi:
                    raise ValueError(
                        f"{where}: no value with {self.decimals} decimals lies in [{lo}, {hi}] (widen the bounds or raise 'precision')"
                    )
        return self

    @property
    def is_categorical(self) -> bool:
        return self.type == "categorical"

    @property
    def decimals(self) -> int:
        return 0 if self.type == "integer" else self.precision

    def grid_bounds(self) -> tuple[int, int]:
        """[min, max] as integers in units of 10^-decimals, shrunk onto the fixed-precision grid.

        Bounds with more decimals than the column keeps (or an integer column with fractional
        bounds) would otherwise round a clipped value to just outside [min, max].
        """
        return _grid(float(self.min), float(self.max), self.decimals)  # type: ignore[arg-type]

    def clip_round(self, x: float) -> float:
        """``x`` rounded to the column's precision and clipped onto the grid inside [min, max]."""
        lo, hi = self.grid_bounds()
        scale = 10**self.decimals
        return min(max(round(x, self.decimals), lo / scale), hi / scale)

    def resolved(self) -> bool:
        """True when bounds/categories are known (public, or already DP-estimated)."""
        return self.categories is not None if self.is_categorical else (self.min is not None and self.max is not None)

    def format_value(self, value) -> str:
        """Canonical text of a value: categories verbatim, numbers clipped to [min, max] at fixed precision."""
        if self.is_categorical:
            text = str(value)
            if text not in (self.categories or []):
                raise DataError(f"column '{self.name}': value is not one of the schema's categories")
            return text
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise DataError(f"column '{self.name}': expected a number") from None
        if not math.isfinite(x):
            raise DataError(f"column '{self.name}': expected a finite number")
        x = self.clip_round(x)
        text = f"{x:.{self.decimals}f}"
        if text.startswith("-") and float(text) == 0.0:
            text = text[1:]  # no negative zero
        return text

    def parse_value(self, text: str):
        """Inverse of :meth:`format_value`; DataError (naming the column, not the value) if invalid."""
        text = text.strip()
        if self.is_categorical:
            if text not in (self.categories or []):
                raise DataError(f"column '{self.name}': not a valid category")
            return text
        try:
            x = float(text)
        except ValueError:
            raise DataError(f"column '{self.name}': not a number") from None
        # Accept what format_value writes: the grid inside [min, max], with the grid's own rounding
        # tolerance (bounds such as -2.7600000000000002 still admit "-2.76").
        g_lo, g_hi = self.grid_bounds()
        if not (math.isfinite(x) and g_lo <= round(x * 10**self.decimals, 6) <= g_hi):
            raise DataError(f"column '{self.name}': number outside [{self.min}, {self.max}]")
        return int(round(x)) if self.type == "integer" else round(x, self.decimals)


class TableSchema(StrictConfig):
    """A public table schema: ordered columns, sensitive attributes and the prediction target."""

    name: str = "table"
    columns: list[ColumnSpec]
    sensitive: list[str] = Field(default_factory=list)
    target: str | None = None
    positive_label: str | None = None
    description: str = ""
    unknown: Literal["other", "drop"] = "other"  # a private value outside a DP-estimated category list
    other_label: str = "Other"

    @model_validator(mode="after")
    def _check(self) -> TableSchema:
        if not self.columns:
            raise ValueError("schema has no columns")
        names = [c.name for c in self.columns]
        o = self.other_label
        if not o or o != o.strip() or any(ch in o for ch in FORBIDDEN_IN_CATEGORY):
            raise ValueError(f"other_label is empty, padded with spaces or contains one of {FORBIDDEN_IN_CATEGORY!r}")
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"duplicate column names: {sorted(dup)}")
        for n in names:
            if not n or any(ch in n for ch in FORBIDDEN_IN_CATEGORY) or n != n.strip():
                raise ValueError(f"column name {n!r} is empty, padded or contains one of {FORBIDDEN_IN_CATEGORY!r}")
        for s in self.sensitive:
            if s not in names:
                raise ValueError(f"sensitive attribute '{s}' is an unknown column (columns: {names})")
        if self.target is not None:
            if self.target not in names:
                raise ValueError(f"target '{self.target}' is an unknown column (columns: {names})")
            tcol = self.columns[names.index(self.target)]
            if not tcol.is_categorical:
                raise ValueError(f"target '{self.target}' must be categorical")
            if self.positive_label is not None and tcol.categories and self.positive_label not in tcol.categories:
                raise ValueError(f"positive_label is not one of target '{self.target}' categories")
        for s in self.sensitive:
            if not self.columns[names.index(s)].is_categorical:
                raise ValueError(f"sensitive attribute '{s}' must be categorical")
        return self

    # ---- lookup -------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> ColumnSpec:
        for c in self.columns:
            if c.name == name:
                return c
        raise ConfigError(f"schema '{self.name}': unknown column '{name}' (columns: {self.names})")

    def select(self, names: list[str] | None) -> TableSchema:
        """Sub-schema with ``names`` (in the given order); sensitive/target kept if selected."""
        if not names:
            return self
        cols = [self.column(n) for n in names]
        target = self.target if self.target in names else None
        return TableSchema(
            name=self.name,
            columns=cols,
            sensitive=[s for s in self.sensitive if s in names],
            target=target,
            positive_label=self.positive_label if target else None,
            description=self.description,
            unknown=self.unknown,
            other_label=self.other_label,
        )

    def with_other_buckets(self) -> TableSchema:
        """With ``unknown: other``, every DP-estimated category list gains ``other_label``.

        Applied to the output of the DP estimate (post-processing: no data, no cost).
        """
        if self.unknown != "other":
            return self
        cols = [
            c.model_copy(update={"categories": [*c.categories, self.other_label]})
            if c.is_categorical and c.domain == "dp" and c.categories is not None and self.other_label not in c.categories
            else c
            for c in self.columns
        ]
        return self.model_copy(update={"columns": cols})

    def require_resolved(self) -> None:
        missing = [c.name for c in self.columns if not c.resolved()]
        if missing:
            raise ConfigError(
                f"schema '{self.name}': columns {missing} have 'domain: dp' and must be estimated "
                "(dpsynth_core.tabular.dp_domain.estimate_domain) before use"
            )

    def positive(self) -> str:
        """The target's positive label (explicit, else the last category)."""
        if self.target is None:
            raise ConfigError(f"schema '{self.name}': no target column")
        return self.positive_label or self.column(self.target).categories[-1]  # type: ignore[index]

    # ---- data -----------------------------------------------------------------------------------
    # Errors name the file (``source``), the column and the 1-based data row (taken from the frame's
    # index: position in the file for a frame read from it or a subset of it); never a value, never
    # a count of affected rows (both may be private).
    def preflight(self, df: pd.DataFrame, source: str = "data") -> None:
        """Check the whole private file before any budget is spent: every column present, every
        public category known, every number a number. DP-estimated columns are not resolved yet:
        their categories are not checked (values outside them are handled by ``unknown``)."""
        missing = [n for n in self.names if n not in df.columns]
        if missing:
            raise DataError(f"{source}: missing columns {missing}")
        for col in self.columns:
            if col.is_categorical:
                if col.domain == "public":
                    _first_bad(df[col.name].astype(str).str.strip().isin(col.categories or []), source, col,
                               "value not in the schema's categories")
            else:
                _first_bad(pd.to_numeric(df[col.name], errors="coerce").notna(), source, col, "expected a number")

    def validate_frame(self, df: pd.DataFrame, source: str = "data") -> pd.DataFrame:
        """Return ``df[self.names]`` with numbers clipped to bounds; DataError names file/column/row.

        A value outside a DP-estimated category list becomes ``other_label`` (``unknown: other``)
        or drops its row (``unknown: drop``); outside a public list it is an error.
        """
        self.require_resolved()
        missing = [n for n in self.names if n not in df.columns]
        if missing:
            raise DataError(f"{source}: missing columns {missing}")
        out = df[self.names].copy()
        keep = pd.Series(True, index=out.index)
        for col in self.columns:
            s = out[col.name]
            if col.is_categorical:
                s = s.astype(str).str.strip()
                known = s.isin(col.categories or [])
                if col.domain == "dp" and self.unknown == "other" and self.other_label in (col.categories or []):
                    s = s.where(known, self.other_label)
                elif col.domain == "dp" and self.unknown == "drop":
                    keep &= known
                else:
                    _first_bad(known, source, col, "value not in the schema's categories")
                out[col.name] = s
            else:
                num = pd.to_numeric(s, errors="coerce")
                _first_bad(num.notna(), source, col, "expected a number")
                g_lo, g_hi = col.grid_bounds()
                scale = 10**col.decimals
                num = num.round(col.decimals).clip(g_lo / scale, g_hi / scale)
                out[col.name] = num.astype(int) if col.type == "integer" else num
        return out[keep].reset_index(drop=True)


def _first_bad(ok: pd.Series, source: str, col: ColumnSpec, problem: str) -> None:
    if not ok.all():
        pos = int((~ok).to_numpy().nonzero()[0][0])
        label = ok.index[pos]
        row = int(label) + 1 if isinstance(label, (int, np.integer)) else pos + 1
        raise DataError(f"{source}: column '{col.name}', row {row}: {problem}")


def load_schema(path: str | Path) -> TableSchema:
    """Load a schema YAML; ConfigError names the file and the problem."""
    return load_config(path, TableSchema)
