"""DPFairLLM driver: the stages of ``dpsynth_core.tabular.pipeline``, the heavy one as a Ray task.

    dpsynth run dpfair --config configs/dpfair_demo.yaml          # resumes output_dir if it holds this run
    dpsynth run dpfair --config configs/dpfair_demo.yaml --fresh  # old run directory moved aside

Joins the cluster of ``RAY_ADDRESS`` (or a submitted job's) or embeds a local Ray
(``ray_jobs.cluster.ensure_ray``). ``train`` + ``generate`` run as one Ray task with the config's
``resources`` (cpus, gpus: a GPU stage must ask, Ray hides GPUs from tasks that do not). The task
gets the config and the run directory path only; it reads the private rows from their source
itself. ``use_ray: false`` runs every stage in this process.
"""

from __future__ import annotations

from pathlib import Path

from dpsynth_core.runs.contract import local_runner
from dpsynth_core.runs.storage_sync import synced_run
from dpsynth_core.tabular.config import DpFairConfig, load_dpfair_config
from dpsynth_core.tabular.pipeline import run_dpfair
from dpsynth_core.tabular.run_schema import public_schema
from ray_jobs.cluster import OFFLINE_ENV, ensure_ray, run_stage_task, stage_in_run_dir, stage_options


def model_stage_resources(cfg: DpFairConfig):
    """The config's resources, with a GPU asked for where ``placement.device`` forces ``cuda``
    (Ray hides GPUs from a task that asks for none)."""
    if cfg.placement.device == "cuda" and not cfg.resources.gpus:
        return cfg.resources.model_copy(update={"gpus": 1.0})
    return cfg.resources


def ray_runner(fn, cfg: DpFairConfig, root: str) -> dict:
    """Run ``fn(cfg, root)`` (the model stage: train + generate) as a Ray task with the config's
    resources; return its summary. The light stages run in the driver (``Stage.in_driver``)."""
    import ray

    opts = stage_options(model_stage_resources(cfg), "model")
    task = ray.remote(stage_in_run_dir(fn, root)).options(  # s3:// / gs://: pulled and pushed on its node
        **opts, max_retries=0, runtime_env={"env_vars": dict(OFFLINE_ENV)}, name=getattr(fn, "__name__", "dpfair_stage"))
    return run_stage_task(task, cfg, str(Path(root).resolve()), stage="model", run_dir=root)


def main(config_path: Path, resume: bool = True) -> Path:
    """Run (or resume) the DPFairLLM pipeline of ``config_path``; return the run directory."""
    return run_on_ray(load_dpfair_config(config_path), resume=resume)


def run_on_ray(cfg: DpFairConfig, resume: bool = True) -> Path:
    """Run (or resume) a DPFairLLM config, its model stage a Ray task (``use_ray: false``: in this process)."""
    with synced_run(cfg.run_dir(), resume=resume):  # s3:// / gs://: a local mirror synced per stage
        if not cfg.use_ray:
            return run_dpfair(cfg, resume=resume, runner=local_runner)
        import ray

        public_schema(cfg)  # config errors before a Ray instance is started
        started = ensure_ray()
        try:
            return run_dpfair(cfg, resume=resume, runner=ray_runner)
        finally:
            if started:
                ray.shutdown()


if __name__ == "__main__":  # python -m ray_jobs.dpfair CONFIG
    import sys

    print(main(Path(sys.argv[1])))
