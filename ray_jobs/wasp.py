"""Driver: `dpsynth run wasp --config FILE` -- WASP with K PLMs generating in parallel (Ray)."""

from __future__ import annotations

from pathlib import Path

from ray_jobs.pe_driver import run_pe


def main(config_path: Path, resume: bool = True) -> Path:
    """Run (or resume) WASP from ``config_path``; returns the run directory."""
    return run_pe(config_path, "wasp", resume=resume)
