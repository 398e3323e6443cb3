"""Driver: `dpsynth run augpe --config FILE` -- Aug-PE (nearest-neighbour DP votes, variations)."""

from __future__ import annotations

from pathlib import Path

from ray_jobs.pe_driver import run_pe


def main(config_path: Path, resume: bool = True) -> Path:
    """Run (or resume) Aug-PE from ``config_path``; returns the run directory."""
    return run_pe(config_path, "augpe", resume=resume)
