"""Shared fixtures: one local Ray per test session, the real data directory, offline hubs.

Ray takes ~8 s to start on 2 cores, so every test that needs it shares ``ray_session``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# CI runs the property tests on a fixed example sequence so that a red run is reproducible and a
# green one is not luck; DPSYNTH_HYPOTHESIS=explore draws fresh examples (hunting for new bugs).
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("DPSYNTH_HYPOTHESIS", "ci"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray instance (2 CPUs), started once and shared by the whole session."""
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            ignore_reinit_error=True,
            runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}},
        )
    yield ray
    try:
        from ray import serve

        serve.shutdown()
    except Exception:
        pass
    ray.shutdown()


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def biorxiv_csv(shared_data_dir: Path) -> Path:
    return shared_data_dir / "biorxiv" / "biorxiv_1500.csv"


@pytest.fixture(scope="session")
def adult_dir(shared_data_dir: Path) -> Path:
    return shared_data_dir / "adult"
