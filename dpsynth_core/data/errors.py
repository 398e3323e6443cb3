"""Build :class:`DataError` messages that say where a problem is, never what the value was.

Every message names the file, and when known the column and the 1-based data row
(row 1 = the first record after any header). Private values are never echoed: the
message describes what was expected instead.
"""

from __future__ import annotations

from pathlib import Path

from dpsynth_core.errors import DataError


def data_error(
    path: str | Path,
    problem: str,
    *,
    column: str | None = None,
    row: int | None = None,
    line: int | None = None,
    hint: str | None = None,
) -> DataError:
    """Return a DataError whose message reads ``FILE: column 'C', row R: PROBLEM. HINT``.

    The location is also attached as attributes (``path``, ``column``, ``row``, ``line``)
    so callers and tests can check it without parsing the message.
    """
    where = [str(path)]
    if column is not None:
        where.append(f"column {column!r}")
    if row is not None:
        where.append(f"row {row}")
    if line is not None:
        where.append(f"line {line}")
    message = f"{', '.join(where)}: {problem}"
    if hint:
        message += f". {hint}"
    exc = DataError(message)
    exc.path = str(path)
    exc.column = column
    exc.row = row
    exc.line = line
    return exc
