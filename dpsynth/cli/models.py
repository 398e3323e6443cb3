"""`dpsynth models list|pull NAME`."""

from __future__ import annotations

import time

import typer

app = typer.Typer(help="Embedded and Hugging Face models: list, pull into the cache.", no_args_is_help=True)


@app.command("list")
def list_cmd() -> None:
    """List the embedded models (any Hugging Face id or local directory also works as a name).

    On a terminal: a table. Piped or redirected: one tab-separated line per model, never truncated.
    """
    import sys

    from dpsynth_core.models import cache_dir, list_models

    specs = list_models()
    if not sys.stdout.isatty():  # Rich would wrap and cut names to 80 columns
        typer.echo(f"# models (cache: {cache_dir()})")
        typer.echo("name\tkind\tsource\tdescription")
        for spec in specs:
            typer.echo("\t".join((spec.name, spec.kind, spec.source, spec.description)))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"models (cache: {cache_dir()})")
    table.add_column("name", no_wrap=True)  # names are typed back in commands: never cut them
    for column in ("kind", "source", "description"):
        table.add_column(column)
    for spec in specs:
        table.add_row(spec.name, spec.kind, spec.source, spec.description)
    Console().print(table)


@app.command()
def pull(name: str = typer.Argument(..., help="Registry name, Hugging Face id or local directory.")) -> None:
    """Materialise a model into the cache (dequantized safetensors) so later loads take seconds."""
    from dpsynth_core.models import pull as pull_model

    start = time.perf_counter()
    path = pull_model(name)
    typer.echo(f"{name}: {path} ({time.perf_counter() - start:.1f} s)")
