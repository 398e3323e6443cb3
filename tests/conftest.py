"""Shared fixtures: one local Ray per test session, the real data directory, offline hubs.

Ray takes ~8 s to start on 2 cores, so every test that needs it shares ``ray_session``.

``scripts/run_tests.sh`` runs the suite on every core (pytest-xdist, ``--dist loadgroup``): each
test file stays in one worker (its module fixtures are built once), and the files that start Ray
Serve share one worker, because Serve's HTTP options are cluster-wide and its default port is one
per machine. Each worker starts its own local Ray (``address="local"``: never a cluster another
worker or a ``ray start`` left on this machine).
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

# AIM (smartnoise-synth -> mbi) runs on JAX, which compiles every op shape with XLA: ~600 compiles,
# most of AIM's ~45 s on these tiny tables. One on-disk cache for every test process, xdist worker
# and Ray worker (they inherit this environment) compiles each shape once; unoptimised XLA code
# runs about as fast on tables this small and costs ~35 % less CPU to compile (no fast-math: only
# float rounding can differ). A fresh clone starts with an empty cache, and AIM's noisy selections
# give new shapes each run: the compile itself is made cheaper too (XLA's classic fusion emitter, one
# codegen unit per program; docs/results/test_suite_time.md).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO_ROOT / ".cache" / "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                      "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1")

SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


SERVE_FILES = {"test_serve_generation.py", "test_serve_limits.py", "test_serve_config.py", "test_pe_runs.py",
               "test_pe_openai_backend.py"}
# the files that share the session's tiny ACTG run (``tiny_actg_run``) and tiny DPFairLLM run
# (``tiny_dpfair_run``): one worker builds each once, in the setup of the file that asserts on the run itself
TINY_RUN_FILES = ("test_actg_pipeline.py", "test_tabular_ledger.py", "test_report.py")


# Minutes-long groups first (longest first, from a full run's durations), so no worker is left with
# one of them at the end; order kept within a group. scripts/run_tests.sh keeps this order in xdist.
SLOW_FIRST = ("tiny_runs", "test_sweep.py", "serve", "test_vllm_ray_llm.py", "test_dpsgd_ray.py",
              "test_gpu_check.py", "test_batch_generate.py", "test_vllm_engine.py",
              "test_fsdp_ray.py", "test_quiet_output.py", "test_dpsgd_privacy.py", "test_dpsgd_core.py",
              "test_cluster.py")


def _group(name: str) -> str:
    return "serve" if name in SERVE_FILES else "tiny_runs" if name in TINY_RUN_FILES else name


@pytest.hookimpl(tryfirst=True)  # before xdist's hook, which turns the markers into "@group" node ids
def pytest_collection_modifyitems(config, items):
    """xdist groups: one per test file, one for every file that starts Ray Serve; slow groups first."""
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    within = {name: i for i, name in enumerate(TINY_RUN_FILES)}
    # stable: file order kept otherwise
    items.sort(key=lambda item: (rank.get(_group(item.path.name), len(rank)), within.get(item.path.name, 0)))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item.path.name)))


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray instance (2 CPUs), started once and shared by the whole session."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",  # a fresh local instance, never another worker's or a `ray start` cluster
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            ignore_reinit_error=True,
            runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}},
            # Ray kills a worker idle for 1 s once there are more than num_cpus of them, and the next stage
            # task pays a fresh process's imports and model loads again (~10 s each here); a few warm ones kept
            _system_config={"num_workers_soft_limit": 4, "idle_worker_killing_time_threshold_ms": 120_000},
        )
    yield ray
    try:
        from ray import serve

        serve.shutdown()
    except Exception:
        pass
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_actg_run(ray_session, tmp_path_factory):
    """configs/actg_tiny.yaml on Ray, crashed after Best-of-N and resumed (tests/tiny_actg_run.py): built once for
    tests/test_actg_pipeline.py and tests/test_report.py (one xdist group); users copy it before changing it."""
    from tests.tiny_actg_run import crash_and_resume

    return crash_and_resume(tmp_path_factory.mktemp("tiny_actg"))


@pytest.fixture(scope="session")
def tiny_dpfair_run(ray_session, adult_dir, tmp_path_factory):
    """A tiny DPFairLLM run through the Ray driver (tests/tiny_dpfair_run.py), every Ray task call recorded: built
    once for tests/test_tabular_ledger.py and tests/test_report.py (one xdist group); users copy it first."""
    from tests.tiny_dpfair_run import finished_dpfair_run

    return finished_dpfair_run(tmp_path_factory.mktemp("tiny_dpfair"))


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
