"""Connect to a Ray cluster when one is given, embed a local Ray otherwise; size stage requests.

Every driver calls :func:`ensure_ray` instead of ``ray.init``:

* inside a submitted job, or with ``RAY_ADDRESS`` set, or with an explicit ``address``: join that
  cluster and pass no resources (Ray refuses ``num_cpus``/``num_gpus`` when connecting);
* otherwise start an embedded local Ray sized by this machine (or by ``num_cpus``/``num_gpus``
  when given), quietly.

It returns whether this call started Ray, so the caller shuts down only what it started.
:func:`stage_options` turns a :class:`~dpsynth_core.config.resources.StageResources` into Ray task/actor
options that fit the cluster (or the enclosing Tune trial), and :func:`where_am_i` is what a stage
records about the node it ran on.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

from dpsynth_core.config.resources import StageResources
from dpsynth_core.errors import ConfigError, DpsynthError

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray in a submitted job's driver


def cluster_address(address: str | None = None) -> str | None:
    """The cluster to join: ``address``, else ``RAY_ADDRESS``; None means embed a local Ray."""
    return address or os.environ.get("RAY_ADDRESS") or None


def _job_env_vars() -> dict:
    """The env_vars of the submitted job's runtime_env (empty outside a job)."""
    try:
        return json.loads(os.environ.get(_JOB_CONFIG_ENV, "{}")).get("runtime_env", {}).get("env_vars", {}) or {}
    except (ValueError, AttributeError):
        return {}


def storage_env() -> dict[str, str]:
    """Where object-store runs live, for every stage's worker: endpoint, region, mirror root.

    Never credentials: each node takes those from its own environment / credential chain."""
    from dpsynth_core.runs.storage import MIRROR_ENV_VAR
    from dpsynth_core.runs.storage_sync import ENDPOINT_ENV

    names = (*ENDPOINT_ENV, "AWS_REGION", "AWS_DEFAULT_REGION", "STORAGE_EMULATOR_HOST", MIRROR_ENV_VAR)
    return {k: os.environ[k] for k in names if os.environ.get(k)}


def ensure_ray(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None,
               env_vars: dict[str, str] | None = None) -> bool:
    """Initialise Ray if needed (join or embed); True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    # Ray refuses to merge a driver's env var with the same key in the job's runtime_env: the job's wins.
    job_env = _job_env_vars()
    from dpsynth_core.quiet import quiet_env  # workers on other nodes do not inherit the CLI's quiet env

    env = {k: v for k, v in {**OFFLINE_ENV, **quiet_env(), **storage_env(), **(env_vars or {})}.items() if k not in job_env}
    target = cluster_address(address)
    common = dict(include_dashboard=False, log_to_driver=True, configure_logging=True, logging_level="WARNING",
                  runtime_env={"env_vars": env, "worker_process_setup_hook": "dpsynth_core.quiet.ray_worker_setup"})
    if target:
        ray.init(address=target, **common)
    else:
        resources = {k: v for k, v in (("num_cpus", num_cpus), ("num_gpus", num_gpus)) if v is not None}
        ray.init(**resources, **common)
    return True


@contextmanager
def ray_session(address: str | None = None, **kwargs):
    """``with ray_session(): ...`` -- Ray for the block; shut down only if this block started it."""
    import ray

    started = ensure_ray(address, **kwargs)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def _largest_node() -> tuple[float, float]:
    """(CPUs, GPUs) of the alive nodes' largest offers (each maximised separately)."""
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    return max((n.get("CPU", 0.0) for n in nodes), default=0.0), max((n.get("GPU", 0.0) for n in nodes), default=0.0)


def stage_options(resources: StageResources, stage: str) -> dict:
    """Ray ``num_cpus``/``num_gpus``/``memory`` for one stage.

    An open ``cpus`` takes up to 2 of what the largest node offers; inside a Tune trial the
    request is capped by the trial's stage bundle (the last one). A request no alive node can
    hold is a ConfigError now, not a task pending forever."""
    import ray

    max_cpu, max_gpu = _largest_node()
    opts = resources.ray_options(max_cpus=max(1.0, max_cpu))
    pg = ray.util.get_current_placement_group()
    if pg is not None:  # inside a Tune trial: the stage must fit the trial's stage bundle
        bundle = pg.bundle_specs[-1]
        opts["num_cpus"] = min(opts["num_cpus"], bundle.get("CPU", opts["num_cpus"]))
        opts["num_gpus"] = min(opts["num_gpus"], bundle.get("GPU", 0.0))
    elif opts["num_cpus"] > max_cpu or opts["num_gpus"] > max_gpu:
        raise ConfigError(
            f"stage '{stage}' asks for {opts['num_cpus']:g} CPU(s) and {opts['num_gpus']:g} GPU(s), but the largest "
            f"node of this Ray cluster offers {max_cpu:g} CPU(s) and {max_gpu:g} GPU(s): lower "
            f"resources (e.g. resources.stages.{stage}) or add a node that fits")
    return opts


class StageLostError(DpsynthError):
    """A stage's task died with its node or worker; what completed before is kept for a resume."""


def stage_in_run_dir(fn, run_dir: str | Path):
    """``fn(cfg, root)`` made a Ray stage: its summary records where it ran (``ran_on``), and for an
    object-store run its node's mirror is pulled before and pushed after it (commit files last)."""
    from dpsynth_core.runs.storage import object_store_uri

    uri = object_store_uri(run_dir)  # computed here: the stage's node may have another mirror root

    def stage(cfg, root: str) -> dict:
        from dpsynth_core.runs.storage_sync import synced_run

        with synced_run(root, uri=uri):
            summary = fn(cfg, root) or {}
        return {**summary, "ran_on": where_am_i()}

    stage.__name__ = stage.__qualname__ = getattr(fn, "__name__", "stage")
    return stage


def run_stage_task(task, *args, stage: str, run_dir: str):
    """``ray.get(task.remote(*args))``; a stage lost with its node/worker becomes one clear error.

    Stages run with ``max_retries=0``: a DP stage is never silently re-run by Ray. Its ledger
    events and completion markers are in the run directory, so resubmitting the same config resumes
    and charges nothing twice. For an object-store run the driver pushes what it wrote (the last
    stage's marker) before the stage and pulls what the stage wrote (on whichever node) after it."""
    import ray
    from ray import exceptions as rx

    from dpsynth_core.runs.storage_sync import mirror_for

    mirror = mirror_for(run_dir)
    try:
        if mirror is not None:
            mirror.push()
        result = ray.get(task.remote(*args))
        if mirror is not None:
            mirror.pull()
        return result
    except (rx.NodeDiedError, rx.WorkerCrashedError, rx.ObjectLostError, rx.OwnerDiedError,
            rx.LocalRayletDiedError, rx.TaskUnschedulableError) as exc:
        raise StageLostError(
            f"stage '{stage}' was lost: its node or worker died ({type(exc).__name__}). Completed stages and the "
            f"privacy ledger are in {run_dir}; resubmit the same config to resume (recorded DP charges are not "
            "repeated)") from None


def where_am_i() -> dict:
    """The node, host and GPU ids of the current Ray task/actor (recorded in stage summaries)."""
    import socket

    import ray

    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "host": socket.gethostname(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}
