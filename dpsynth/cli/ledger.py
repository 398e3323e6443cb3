"""`dpsynth ledger show RUN_DIR`: a run's privacy spend, per stage and composed."""

from __future__ import annotations

import json
from pathlib import Path

import typer

app = typer.Typer(help="Inspect a run's privacy ledger.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Inspect a run's privacy ledger."""  # keeps `ledger` a group even with one subcommand


@app.command()
def show(
    run_dir: Path = typer.Argument(..., help="Run directory containing ledger.sqlite."),
    as_json: bool = typer.Option(False, "--json", help="Print the ledger as JSON instead of a table."),
) -> None:
    """Show every recorded event and the composed (epsilon, delta) against the budget."""
    from dpsynth_core.privacy import PrivacyLedger

    ledger = PrivacyLedger.open(run_dir)
    if as_json:
        typer.echo(json.dumps(ledger.to_dict(), indent=2))
    else:
        typer.echo(ledger.render(), nl=False)
