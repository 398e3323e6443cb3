"""`dpsynth models list|pull NAME`."""

from __future__ import annotations

import time

import typer

app = typer.Typer(help="Embedded and Hugging Face models: list, pull into the cache.", no_args_is_help=True)


@app.command("list")
def list_cmd() -> None:
    """List the embedded models (any Hugging Face id or local directory also works as a name)."""
    from rich.console import Console
    from rich.table import Table

    from dpsynth_core.models import cache_dir, list_models

    table = Table(title=f"models (cache: {cache_dir()})")
    for column in ("name", "kind", "source", "description"):
        table.add_column(column)
    for spec in list_models():
        table.add_row(spec.name, spec.kind, spec.source, spec.description)
    Console().print(table)


@app.command()
def pull(name: str = typer.Argument(..., help="Registry name, Hugging Face id or local directory.")) -> None:
    """Materialise a model into the cache (dequantized safetensors) so later loads take seconds."""
    from dpsynth_core.models import pull as pull_model

    start = time.perf_counter()
    path = pull_model(name)
    typer.echo(f"{name}: {path} ({time.perf_counter() - start:.1f} s)")
