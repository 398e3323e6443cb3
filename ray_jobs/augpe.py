"""Driver: `dpsynth run augpe --config FILE` -- Aug-PE (nearest-neighbour DP votes, variations)."""

from __future__ import annotations

from pathlib import Path

import ray

from dpsynth_core.pe.pipeline import load_pe_config, run_pipeline
from dpsynth_core.storage import require_durable_run_dir
from ray_jobs.pe_backends import make_llms


def main(config_path: Path, resume: bool = True) -> Path:
    """Run (or resume) Aug-PE from ``config_path``; returns the run directory."""
    # a submitted job must write to shared storage, not to its temporary working directory
    require_durable_run_dir(load_pe_config(config_path, "augpe").run_dir)
    started = not ray.is_initialized()
    try:
        return run_pipeline(config_path, "augpe", make_llms, resume=resume)
    finally:
        if started and ray.is_initialized():
            ray.shutdown()
