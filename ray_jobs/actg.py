"""ACTG-ARL driver: every stage of ``dpsynth_core.actg.pipeline`` as a Ray task.

    dpsynth run actg --config configs/actg_demo.yaml          # resumes runs/<name> if present
    dpsynth run actg --config configs/actg_demo.yaml --fresh  # old run directory moved aside

Each stage runs in a Ray task sized by the config's ``resources`` (default: up to 2 CPUs, no GPU;
``resources.stages.private: {gpus: 1}`` puts DP-SGD on a GPU node) and gets only the config and the
run directory path; stages hand artifacts to each other through the run directory, and each
done-marker records the node (and GPU ids) its stage ran on. Inside a submitted job the run
directory must be shared storage (``dpsynth_core.runs.storage``). The ``private`` stage is the only one
that reads private records. The ``anchored_rl`` stage runs in a worker of its own runtime
environment (never one that ran another stage) whose ``DPSYNTH_DATA_DIR`` is ``/dev/null``, so even a
stray ``data_dir()`` call there finds no private file.
DP-SGD runs in the ``private`` stage's worker (``generator.num_workers: 1``). The engine no longer
starts Ray Train itself: multi-worker DP-SGD needs a runner (``ray_jobs.dp_finetune``) and an
example source the Train workers load themselves (the examples are records plus extracted
attributes, held in memory), which ACTG does not provide yet, so ``num_workers > 1`` is refused
with a clear error.
"""

from __future__ import annotations

import os
from pathlib import Path

from dpsynth_core.actg.pipeline import ActgConfig, load_actg_config, run_pipeline
from dpsynth_core.runs.storage import require_durable_run_dir
from dpsynth_core.runs.storage_sync import synced_run
from ray_jobs.cluster import OFFLINE_ENV, ray_session, run_stage_task, stage_in_run_dir, stage_options


def stage_devices(cfg: ActgConfig, stage: str) -> list[str]:
    """The ``device`` knobs of the models a stage runs (ACTG's generator, reward judge, RL policy)."""
    reward = cfg.reward or cfg.extractor
    return {"private": [cfg.generator.get("device", "auto")], "generate": [cfg.generation.device],
            "best_of_n": [reward.device], "anchored_rl": [cfg.rl.device, reward.device],
            "synthesize": [cfg.generation.device]}.get(stage, [])


def stage_resources(cfg: ActgConfig, stage: str):
    """``resources`` of the stage, with a GPU asked for where its config forces ``cuda`` (Ray hides
    GPUs from a task that asks for none, and the stage would then refuse to start)."""
    resources = cfg.resources.for_stage(stage)
    if "cuda" in stage_devices(cfg, stage) and not resources.gpus:
        resources = resources.model_copy(update={"gpus": 1.0})
    return resources


# Never a directory, so a stray ``data_dir()`` in the RL stage raises. One value for every run: Ray keeps a worker
# pool per runtime environment, so RL stages reuse each other's warm workers, never one that ran another stage.
NO_DATA_DIR = os.devnull


def ray_runner(fn, cfg: ActgConfig, root: str, *, isolated: bool = False) -> dict:
    """Run ``fn(cfg, root)`` as a Ray task sized by ``cfg.resources``; return its (small, JSON) summary."""
    import ray

    name = getattr(fn, "__name__", "actg_stage")
    stage = name.removeprefix("stage_")
    opts = stage_options(stage_resources(cfg, stage), stage)
    env = dict(OFFLINE_ENV)
    if isolated:  # the RL stage: no private data directory reachable from its worker
        env["DPSYNTH_DATA_DIR"] = NO_DATA_DIR
    task = ray.remote(stage_in_run_dir(fn, root)).options(**opts, max_retries=0, runtime_env={"env_vars": env}, name=name)
    return run_stage_task(task, cfg, str(Path(root).resolve()), stage=stage, run_dir=root)


def serve_best_of_n(app: str, request: dict) -> list:
    """Best-of-N on the running Serve app ``app`` (``best_of_n.serve_app``): the callable the library's
    ``best_of_n`` stage calls, so the library itself imports neither Ray nor ``serving``."""
    from serving.client import GenerationClient

    return GenerationClient(app).best_of_n(**request)


def run_on_ray(cfg: ActgConfig, resume: bool = True) -> Path:
    """Run (or resume) an ACTG config on Ray, each stage a task; return the run directory."""
    for k, v in OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    run_dir = require_durable_run_dir(cfg.resolved_run_dir())  # a submitted job must write to shared storage
    with synced_run(run_dir, resume=resume), ray_session():  # s3:// / gs://: a mirror synced per stage
        return run_pipeline(cfg, resume=resume, runner=ray_runner, serve_best_of_n=serve_best_of_n)


def main(config_path: Path, resume: bool = True) -> Path:
    """Run (or resume) the ACTG pipeline of ``config_path`` on Ray; return the run directory."""
    return run_on_ray(load_actg_config(config_path), resume=resume)


def summary(run_dir: Path) -> str:
    """The headline figures of a finished run (what `make demo` prints after the ledger)."""
    from dpsynth_core.actg.report import summarize

    return summarize(run_dir)


if __name__ == "__main__":  # python -m ray_jobs.actg CONFIG | python -m ray_jobs.actg --summary RUN_DIR
    import sys

    if sys.argv[1] == "--summary":
        print(summary(Path(sys.argv[2])))
    else:
        print(main(Path(sys.argv[1])))
