"""`dpsynth data check FILE`: validate a private data file before a run.

Prints only structural facts (row count, column names and dtypes, OK) — never values,
and no statistics of values, since those are private too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dpsynth_core.errors import DataError

app = typer.Typer(help="Check a private data file before a run.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Check a private data file before a run (prints structure only, never values)."""


def parse_columns_option(spec: str | None) -> list[str] | dict[str, str] | None:
    """Parse ``a,b,c`` (names) or ``age:numeric,sex:categorical`` (names with types)."""
    if not spec:
        return None
    items = [s.strip() for s in spec.split(",") if s.strip()]
    if not items:
        return None
    if not any(":" in s for s in items):
        return items
    typed: dict[str, str] = {}
    for item in items:
        name, _, kind = item.partition(":")
        kind = kind.strip() or "categorical"
        if kind not in ("categorical", "numeric"):
            raise DataError(f"--columns: column {name.strip()!r} has unknown type {kind!r}; expected categorical or numeric")
        typed[name.strip()] = kind
    return typed


@app.command("check")
def check(
    file: Path = typer.Argument(..., help="CSV, JSONL or Parquet file (chosen by extension)."),
    text_col: Optional[str] = typer.Option(None, "--text-col", help="Column holding the free text."),
    label_col: Optional[str] = typer.Option(None, "--label-col", help="Column holding the class label."),
    user_col: Optional[str] = typer.Option(None, "--user-col", help="Column holding the user id (user-level privacy)."),
    columns: Optional[str] = typer.Option(
        None, "--columns",
        help="Tabular columns: 'a,b,c' or with types 'age:numeric,sex:categorical'.",
    ),
    max_chars: int = typer.Option(20000, "--max-chars", min=1, help="Longest allowed text (characters)."),
) -> None:
    """Validate FILE with the given column mapping; print its shape and column types, or the first problem."""
    from dpsynth_core.data import load_records

    frame = load_records(
        file, text_col=text_col, label_col=label_col, user_col=user_col,
        columns=parse_columns_option(columns), max_chars=max_chars,
    )
    roles = {text_col: "text", label_col: "label", user_col: "user id"}
    typer.echo(f"file: {file}")
    typer.echo(f"rows: {len(frame)}")
    typer.echo(f"columns: {len(frame.columns)}")
    for name in frame.columns:
        role = roles.get(name)
        typer.echo(f"  {name}: {frame[name].dtype}" + (f" ({role})" if role else ""))
    typer.secho("OK", fg="green")
