"""`dpsynth config resolve --config FILE [--run RUN_DIR]`: a DPFairLLM config as a run resolves it."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="Show a config as a run resolves it.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Show a config as a run resolves it."""  # keeps `config` a group even with one subcommand


@app.command()
def resolve(
    config: Path = typer.Option(..., "--config", "-c", help="DPFairLLM config (YAML)."),
    run_dir: Path | None = typer.Option(None, "--run", help="A run of it: show the choices that run made from its "
                                                           "DP tables (stratify: auto)."),
) -> None:
    """Print the DPFairLLM config with every default and recipe setting filled in (public config only)."""
    import yaml

    from dpsynth.api import DPFairLLM

    resolved = DPFairLLM.from_yaml(config).resolved_config(run_dir)
    typer.echo(yaml.safe_dump(resolved, sort_keys=False), nl=False)
    if resolved["generation"]["calibrate"].get("stratify") == "auto":
        typer.echo("# stratify: auto is chosen by each run from its DP tables: see resolved_config.yaml in the run "
                   "directory, or pass --run")
