"""`dpsynth generate --config FILE`: batch generation with Ray Data (see ray_jobs/batch_generate.py)."""

from __future__ import annotations

from pathlib import Path

import typer


def generate(
    config: Path = typer.Option(..., "--config", "-c", help="Batch generation config (YAML)."),
) -> None:
    """Generate many texts or rows from a (DP-trained) generator, sharded and resumable."""
    from ray_jobs.batch_generate import main

    out = main(config, resume=True)
    typer.echo(f"shards in {out}")
