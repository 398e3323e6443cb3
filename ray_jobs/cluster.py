"""Connect to a Ray cluster when one is given, embed a local Ray otherwise.

Every driver calls :func:`ensure_ray` instead of ``ray.init``:

* inside a submitted job, or with ``RAY_ADDRESS`` set, or with an explicit ``address``: join that
  cluster and pass no resources (Ray refuses ``num_cpus``/``num_gpus`` when connecting);
* otherwise start an embedded local Ray sized by this machine (or by ``num_cpus``/``num_gpus``
  when given), quietly.

It returns whether this call started Ray, so the caller shuts down only what it started.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def cluster_address(address: str | None = None) -> str | None:
    """The cluster to join: ``address``, else ``RAY_ADDRESS``; None means embed a local Ray."""
    return address or os.environ.get("RAY_ADDRESS") or None


def ensure_ray(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None,
               env_vars: dict[str, str] | None = None) -> bool:
    """Initialise Ray if needed (join or embed); True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    env = {**OFFLINE_ENV, **(env_vars or {})}
    target = cluster_address(address)
    common = dict(include_dashboard=False, log_to_driver=True, configure_logging=True, logging_level="WARNING",
                  runtime_env={"env_vars": env})
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
