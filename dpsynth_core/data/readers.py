"""Read a CSV, JSONL or Parquet file into a raw DataFrame, by extension.

Readers only parse; checks on columns and values live in :mod:`validation`. CSV cells are
read as strings (empty cell -> NaN) so that a literal "NA" in a text column stays text and
numeric conversion happens, with row-level errors, only where a column is declared numeric.
"""

from __future__ import annotations

import codecs
import io
import json
import re
from pathlib import Path

import pandas as pd

from dpsynth_core.data.errors import data_error

SUPPORTED_SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}

# Undecodable bytes are decoded as the noncharacter U+10FFFE so the parsed table can say in
# which column and row they sit (pandas cannot take the lone surrogates of `surrogateescape`).
_BAD_BYTE_MARK = "\U0010fffe"
_ESCAPED_BYTE = re.compile(_BAD_BYTE_MARK)
_HANDLER = "dpsynth-mark-bad-bytes"


def _mark_bad_bytes(exc: UnicodeDecodeError) -> tuple[str, int]:
    return _BAD_BYTE_MARK * (exc.end - exc.start), exc.end


codecs.register_error(_HANDLER, _mark_bad_bytes)


def file_format(path: Path) -> str:
    """Return "csv", "jsonl" or "parquet" for a path, or raise DataError for other extensions."""
    fmt = SUPPORTED_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise data_error(
            path,
            f"unsupported file extension {path.suffix!r}",
            hint="Expected one of .csv, .jsonl (or .ndjson), .parquet (or .pq)",
        )
    return fmt


def read_frame(path: str | Path) -> pd.DataFrame:
    """Parse ``path`` into a DataFrame (no value checks). Raises DataError on any read problem."""
    path = Path(path)
    if not path.exists():
        raise data_error(path, "file not found", hint=f"Looked for {path.resolve()}")
    if not path.is_file():
        raise data_error(path, "not a regular file")
    fmt = file_format(path)
    if fmt == "parquet":
        return _read_parquet(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise data_error(path, f"cannot read file ({exc.strerror or type(exc).__name__})") from None
    if not raw.strip():
        raise data_error(path, "file is empty (0 rows)")
    text, bad_offset = _decode(raw)
    if fmt == "csv":
        return _read_csv(path, text, raw, bad_offset)
    return _read_jsonl(path, text, raw, bad_offset)


def _decode(raw: bytes) -> tuple[str, int | None]:
    """Decode UTF-8 (BOM tolerated); return the text and the first bad byte offset, if any."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
        shift = 3
    else:
        shift = 0
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return raw.decode("utf-8", errors=_HANDLER), exc.start + shift


def _non_utf8_error(path: Path, raw: bytes, offset: int, *, column=None, row=None):
    line = raw.count(b"\n", 0, offset) + 1
    return data_error(
        path,
        f"bytes that are not valid UTF-8 (first at byte offset {offset}, line {line} of the file)",
        column=column,
        row=row,
        hint="Re-save the file as UTF-8",
    )


def _read_csv(path: Path, text: str, raw: bytes, bad_offset: int | None) -> pd.DataFrame:
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, na_values=[""])
    except pd.errors.EmptyDataError:
        raise data_error(path, "file is empty (no header, 0 rows)") from None
    except (pd.errors.ParserError, ValueError) as exc:
        # pandas' parser messages name line numbers and field counts, not cell contents.
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if bad_offset is not None:
            raise _non_utf8_error(path, raw, bad_offset) from None
        raise data_error(path, f"malformed CSV ({detail})") from None
    if bad_offset is not None:
        raise _locate_bad_bytes(path, frame, raw, bad_offset)
    return frame


def _locate_bad_bytes(path: Path, frame: pd.DataFrame, raw: bytes, offset: int):
    """Find the column and data row holding the first undecodable byte (falls back to the offset)."""
    for name in frame.columns:
        if _ESCAPED_BYTE.search(str(name)):
            return _non_utf8_error(path, raw, offset, column="<header>")
    for name in frame.columns:
        col = frame[name]
        hits = col.map(lambda v: isinstance(v, str) and bool(_ESCAPED_BYTE.search(v)))
        if hits.any():
            row = int(hits.to_numpy().argmax()) + 1
            return _non_utf8_error(path, raw, offset, column=str(name), row=row)
    return _non_utf8_error(path, raw, offset)


def _read_jsonl(path: Path, text: str, raw: bytes, bad_offset: int | None) -> pd.DataFrame:
    records: list[dict] = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue  # blank lines (e.g. a trailing newline) are not records
        row = len(records) + 1
        if _ESCAPED_BYTE.search(line):
            raise data_error(
                path,
                f"bytes that are not valid UTF-8 (first at byte offset {bad_offset})",
                row=row,
                line=line_no,
                hint="Re-save the file as UTF-8",
            )
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise data_error(
                path, f"malformed JSON ({exc.msg} at character {exc.pos})", row=row, line=line_no,
                hint="Each line must be one JSON object",
            ) from None
        if not isinstance(record, dict):
            raise data_error(
                path, f"expected a JSON object, found a JSON {type(record).__name__}", row=row, line=line_no
            )
        records.append(record)
    if not records:
        raise data_error(path, "file has no records (0 rows)")
    return pd.DataFrame.from_records(records)


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types; none of them carry cell values
        raise data_error(path, f"cannot read Parquet file ({type(exc).__name__})") from None
    # Binary columns: decode to str so undecodable bytes are reported like in text formats.
    for name in frame.columns:
        col = frame[name]
        if col.dtype == object and col.map(lambda v: isinstance(v, bytes)).any():
            decoded = []
            for i, value in enumerate(col, start=1):
                if isinstance(value, bytes):
                    try:
                        value = value.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise data_error(
                            path, f"bytes that are not valid UTF-8 (byte offset {exc.start} in the cell)",
                            column=str(name), row=i, hint="Store text as UTF-8",
                        ) from None
                decoded.append(value)
            frame[name] = pd.Series(decoded, index=frame.index, dtype=object)
    return frame
