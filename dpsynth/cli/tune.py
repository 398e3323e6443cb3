"""`dpsynth tune --config FILE`: a privacy-aware sweep on Ray Tune (see ray_jobs/sweep.py)."""

from __future__ import annotations

from pathlib import Path

import typer


def tune(config: Path = typer.Option(..., "--config", "-c", help="Sweep config (YAML).")) -> None:
    """Hyperparameter sweep: public/proxy data, or DP selection (private-free metric, cost bounded
    over the whole space before any trial, only the best trial released with the cost in its ledger)."""
    from ray_jobs.sweep import main

    main(config)
