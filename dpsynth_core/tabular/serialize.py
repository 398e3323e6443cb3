"""Rows as text: ``age: 39, workclass: Private, ..., income: <=50K`` and back.

A row is a sequence of *segments*: a forced name segment (``"age:"``, then ``", workclass:"``, ...)
followed by a value segment (``" 39"``). Segment boundaries fall on the byte-level BPE
pre-token boundaries (before a space or punctuation), so tokenizing segment by segment gives the
same ids as tokenizing the whole row: constrained decoding and training see the same tokens.

Numbers are written at the schema's fixed precision, clipped to the schema bounds. Optionally the
column order is shuffled per row; the prompt then shows the order (``Order: a, b, c``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import pandas as pd

from dpsynth_core.errors import ConfigError, DataError
from dpsynth_core.tabular.schema import TableSchema

PrefixMode = Literal["full", "names", "none"]


class RowParseError(DataError):
    """Generated or stored text that is not a valid row of the schema."""


@dataclass
class RowSerializer:
    """Serialize rows of ``schema`` to text and parse them back.

    ``prefix``: ``full`` describes every column (type, range, categories), ``names`` lists column
    names only (short prompts = fast CPU training), ``none`` gives just the table name.
    """

    schema: TableSchema
    separator: str = ", "
    prefix: PrefixMode = "names"
    random_order: bool = False
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.schema.require_resolved()
        if not self.separator.endswith(" ") or not self.separator.strip():
            raise ConfigError("serializer separator must be a non-space mark followed by a space, e.g. ', '")
        mark = self.separator.strip()
        for col in self.schema.columns:
            if mark in col.name:
                raise ConfigError(f"column '{col.name}': name contains the separator mark {mark!r}")
            for i, cat in enumerate(col.categories or []):
                if mark in cat:
                    raise ConfigError(f"column '{col.name}': category #{i} contains the separator mark {mark!r}")
        self._rng = random.Random(self.seed)

    # ---- segments ---------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return self.schema.names

    def name_segment(self, position: int, name: str) -> str:
        """Forced text before the value of the column at ``position`` in the row."""
        return (self.separator.rstrip() + " " if position else "") + f"{name}:"

    @staticmethod
    def value_segment(value_text: str) -> str:
        return " " + value_text

    def order_for_row(self) -> list[str]:
        """Column order of the next row: schema order, or a fresh shuffle if ``random_order``."""
        order = list(self.names)
        if self.random_order:
            self._rng.shuffle(order)
        return order

    # ---- text ---------------------------------------------------------------------------------
    def schema_prefix(self) -> str:
        s = self.schema
        if self.prefix == "none":
            return f"Table {s.name}."
        if self.prefix == "names":
            return f"Table {s.name} with columns: {', '.join(s.names)}."
        parts = []
        for c in s.columns:
            if c.is_categorical:
                parts.append(f"{c.name} (one of {' / '.join(c.categories or [])})")
            else:
                lo, hi = c.format_value(c.min), c.format_value(c.max)
                parts.append(f"{c.name} ({c.type} {lo} to {hi})")
        return f"Table {s.name}. Columns: " + "; ".join(parts) + "."

    def prompt(self, order: Sequence[str] | None = None) -> str:
        """Prompt that precedes a row (public text only)."""
        text = self.schema_prefix()
        if self.random_order and order is not None:
            text += " Order: " + ", ".join(order) + "."
        return text + "\n"

    def to_text(self, row: dict | pd.Series, order: Sequence[str] | None = None) -> str:
        order = list(order) if order is not None else self.names
        out = []
        for i, name in enumerate(order):
            col = self.schema.column(name)
            out.append(self.name_segment(i, name) + self.value_segment(col.format_value(row[name])))
        return "".join(out)

    def parse(self, text: str, order: Sequence[str] | None = None) -> dict:
        """Parse ``to_text`` output back into ``{column: value}``; RowParseError names the column.

        Columns may come in any order (the names are in the text); each must appear exactly once.
        If ``order`` is given, it must match.
        """
        text = text.strip()
        if not text:
            raise RowParseError("empty row text")
        parts = text.split(self.separator.rstrip() + " ")
        row: dict = {}
        seen: list[str] = []
        for i, part in enumerate(parts):
            name, sep, value = part.partition(": ")
            if not sep:
                raise RowParseError(f"field #{i}: expected '<column>: <value>'")
            name = name.strip()
            if name not in self.names:
                raise RowParseError(f"field #{i}: unknown column")
            if name in row:
                raise RowParseError(f"column '{name}' appears twice")
            try:
                row[name] = self.schema.column(name).parse_value(value)
            except DataError as exc:
                raise RowParseError(str(exc)) from None
            seen.append(name)
        missing = [n for n in self.names if n not in row]
        if missing:
            raise RowParseError(f"missing columns {missing}")
        if order is not None and list(order) != seen:
            raise RowParseError("columns not in the requested order")
        return row

    # ---- frames -------------------------------------------------------------------------------
    def examples(self, df: pd.DataFrame) -> list[tuple[str, str]]:
        """(prompt, target) pairs for training, one per row of the (validated) frame."""
        pairs = []
        for _, row in df.iterrows():
            order = self.order_for_row()
            pairs.append((self.prompt(order), self.to_text(row, order)))
        return pairs

    def parse_many(self, texts: Sequence[str]) -> tuple[pd.DataFrame, int]:
        """Parse texts; returns (frame of valid rows in schema column order, number of invalid rows)."""
        rows, bad = [], 0
        for t in texts:
            try:
                rows.append(self.parse(t))
            except DataError:
                bad += 1
        return pd.DataFrame(rows, columns=self.names), bad
