"""`dpsynth generate --config FILE`: batch generation with Ray Data (see ray_jobs/batch_generate.py)."""

from __future__ import annotations

from pathlib import Path

import typer


def generate(
    config: Path = typer.Option(..., "--config", "-c", help="Batch generation config (YAML)."),
    check: bool = typer.Option(False, "--check", help="Only the pre-flight: validate config and prompts, print the "
                                                     "plan, write nothing."),
) -> None:
    """Generate many texts or rows from a (DP-trained) generator, sharded and resumable."""
    from ray_jobs.batch_generate import main, preflight

    if check:
        typer.echo(preflight(config).render())
        return

    out = main(config, resume=True)
    typer.echo(f"shards in {out}")
