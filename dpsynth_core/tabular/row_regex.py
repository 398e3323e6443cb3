"""A regular expression that matches exactly the row texts :class:`RowSerializer` writes for one
column order: the language the HF :class:`~dpsynth_core.tabular.constrained.ConstrainedRowProcessor`
allows, in the form vLLM's structured outputs (xgrammar) take.

Categorical values are an alternation of the escaped categories; numeric values are the canonical
fixed-precision numbers inside the column's grid [lo, hi] (no leading zeros, no negative zero), built
digit by digit like any integer-range regex, with the decimal point put back before the last
``decimals`` digits. Schema text only (public): no private data goes into the pattern.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dpsynth_core.tabular.schema import ColumnSpec
from dpsynth_core.tabular.serialize import RowSerializer

Pattern = list[str]  # one alternative: one character class per digit position


def _escape(text: str) -> str:
    # re.escape writes a space as "\\ ", which xgrammar's regex parser warns about; a plain space means the same.
    return re.escape(text).replace("\\ ", " ")


def _class(lo: str, hi: str) -> str:
    if lo == hi:
        return lo
    return r"\d" if (lo, hi) == ("0", "9") else f"[{lo}-{hi}]"


def _same_length_range(lo: str, hi: str) -> list[Pattern]:
    """Alternatives matching every digit string s with len(s) == len(lo) and lo <= s <= hi."""
    if not lo:
        return [[]]
    if lo[0] == hi[0]:
        return [[lo[0]] + rest for rest in _same_length_range(lo[1:], hi[1:])]
    n = len(lo) - 1
    out = [[lo[0]] + rest for rest in _same_length_range(lo[1:], "9" * n)]
    if int(hi[0]) - int(lo[0]) > 1:
        out.append([_class(str(int(lo[0]) + 1), str(int(hi[0]) - 1))] + [r"\d"] * n)
    out += [[hi[0]] + rest for rest in _same_length_range("0" * n, hi[1:])]
    return out


def _abs_range(lo: int, hi: int, decimals: int) -> list[str]:
    """Regex alternatives for the texts of |k| / 10**decimals, k in [lo, hi] (0 <= lo <= hi)."""
    width = decimals + 1  # at least one integer digit: 5 -> "0.05" at two decimals
    out = []
    length = max(width, len(str(lo)))
    while lo <= hi:
        top = min(hi, 10**length - 1)
        for alt in _same_length_range(str(lo).zfill(length), str(top).zfill(length)):
            if decimals:
                alt = alt[:-decimals] + [r"\."] + alt[-decimals:]
            out.append("".join(alt))
        lo, length = top + 1, length + 1
    return out


def number_regex(col: ColumnSpec) -> str:
    """The canonical numbers of a numeric/integer column (what ``format_value`` writes)."""
    lo, hi = col.grid_bounds()
    alts = []
    if hi >= 0:
        alts += _abs_range(max(lo, 0), hi, col.decimals)
    if lo < 0:
        alts += ["-" + a for a in _abs_range(max(1, -hi), -lo, col.decimals)]  # no negative zero
    return "(" + "|".join(alts) + ")"


def value_regex(col: ColumnSpec) -> str:
    if col.is_categorical:
        return "(" + "|".join(_escape(c) for c in col.categories or []) + ")"
    return number_regex(col)


def row_regex(serializer: RowSerializer, order: Sequence[str]) -> str:
    """Every row text ``serializer.to_text(row, order)`` can produce, and nothing else."""
    schema = serializer.schema
    return "".join(_escape(serializer.name_segment(i, name)) + " " + value_regex(schema.column(name))
                   for i, name in enumerate(order))


def _longest_value(col: ColumnSpec) -> str:
    if col.is_categorical:
        return max(col.categories or [""], key=lambda c: len(c.encode()))
    lo, hi = col.grid_bounds()
    return max((f"{k / 10**col.decimals:.{col.decimals}f}" for k in (lo, hi)), key=len)


def max_row_tokens(serializer: RowSerializer, order: Sequence[str]) -> int:
    """A token budget no tokenization of a row can exceed: its longest text in bytes (a token is at
    least one byte), plus one for the end of sequence. Structured outputs let the model pick any
    tokenization the regex allows, so the HF processor's count of its own forced tokens is too small."""
    schema = serializer.schema
    longest = "".join(serializer.name_segment(i, name) + " " + _longest_value(schema.column(name))
                      for i, name in enumerate(order))
    return len(longest.encode()) + 1
