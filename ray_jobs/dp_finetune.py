"""Ray Train driver for DP-SGD LoRA: a TorchTrainer with N workers (gloo on CPU, nccl on GPU).

Privacy mechanics stay in ``dpsynth_core.dpsgd``; this file only places workers:
- every rank draws the same global Poisson batch and keeps its shard, so all ranks take every
  step (empty shards included) and the all-reduce never hangs;
- rank 0 alone adds the Gaussian noise before the all-reduce: noise exactly once per logical
  batch, so epsilon does not depend on the number of workers;
- rank 0 reports a checkpoint every ``checkpoint_every`` steps through ``ray.train.report``
  (other ranks report metrics only); a restarted worker group resumes from
  ``ray.train.get_checkpoint()``, a restarted job from the newest checkpoint in storage;
- the DRIVER checks the ledger before the job and records ONE event for the steps actually run
  after it, so a resume neither double-counts nor drops steps; a checkpoint made under another
  config or privacy plan is deleted and the resume refused;
- no private value crosses Ray's control plane: ``train_loop_config`` (which Train's state
  tracking stringifies) holds public config and an ``ExampleSource`` that each worker loads
  itself; the secret sampling seed and the per-example penalty travel as an object-store ref.

Called as ``train_dp_lora(source, config, ..., runner=run_dp_finetune)``: the library does not
import this module.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from dpsynth_core.dpsgd.checkpoint import (
    STATE_FILE,
    TrainState,
    check_resumable,
    is_checkpoint,
    load_checkpoint,
    write_checkpoint_files,
)
from dpsynth_core.config.resources import StageResources
from dpsynth_core.dpsgd.config import DpSgdConfig, TrainResult
from dpsynth_core.dpsgd.sources import ExampleSource, is_shippable
from dpsynth_core.dpsgd.trainer import (
    epsilon_schedule,
    finalize_run,
    new_sampling_seed,
    new_train_state,
    prepare_stage,
)
from dpsynth_core.errors import ConfigError

RAY_STORAGE_DIRNAME = "ray_train"
FINAL_ADAPTER_SUBDIR = "adapter"
_RUN_PREFIX = "dp_finetune_"


def _run_name(fingerprint: str) -> str:
    return f"{_RUN_PREFIX}{fingerprint}"


def stored_checkpoints(storage: Path) -> list[tuple[Path, TrainState]]:
    """Every complete checkpoint under the Ray storage dir, whatever its config."""
    found = []
    for state_file in Path(storage).glob(f"{_RUN_PREFIX}*/*/{STATE_FILE}"):
        if is_checkpoint(state_file.parent):
            found.append((state_file.parent, TrainState.from_json(state_file.read_text(encoding="utf-8"))))
    return found


def latest_checkpoint(storage: Path, plan, fingerprint: str) -> Path | None:
    """Newest checkpoint of this config and privacy plan, or None. A checkpoint of another one
    is refused: the storage dir (every copy of the secret seed) is deleted, then ConfigError."""
    best, best_step = None, -1
    for d, state in stored_checkpoints(storage):
        try:
            check_resumable(state, plan, fingerprint, d)
        except ConfigError:
            shutil.rmtree(storage, ignore_errors=True)
            raise
        if state.step > best_step:
            best, best_step = d, state.step
    return best


def _train_loop(loop_config: dict) -> None:
    """Runs on every Ray Train worker: loads the private examples from their source itself."""
    import ray
    import ray.train
    import torch

    from dpsynth_core.dpsgd.budget import PrivacyPlan
    from dpsynth_core.dpsgd.engine import DistContext, DpSgdEngine, resolve_device
    from dpsynth_core.dpsgd.sampling import PrivacyUnits
    from dpsynth_core.dpsgd.trainer import run_steps

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    config = DpSgdConfig.model_validate(loop_config["config"])
    plan = PrivacyPlan(**loop_config["plan"])
    fingerprint = loop_config["fingerprint"]
    secret = ray.get(loop_config["secret"])  # seed and penalty: object store, not the run's config/state
    torch.set_num_threads(config.torch_threads or 1)
    examples = loop_config["source"].load()
    if len(PrivacyUnits.from_user_ids([e.user_id for e in examples])) != plan.n_units:
        raise ConfigError(f"{loop_config['source'].describe()}: the data changed while the job started; run again")
    engine_class = DpSgdEngine
    if config.gpu_strategy == "fsdp2":  # sharded weights, opacus ghost_fsdp (dpsynth_core.dpsgd.fsdp)
        from dpsynth_core.dpsgd.fsdp import FsdpDpSgdEngine as engine_class
    sharded = config.gpu_strategy == "fsdp2"
    engine = engine_class(
        examples, config,
        noise_multiplier=plan.noise_multiplier, sampling_seed=secret["sampling_seed"],
        dist=DistContext(rank, world), device=resolve_device(config, ctx.get_local_rank()),
        per_example_penalty=secret["per_example_penalty"],
    )
    del examples
    state = new_train_state(secret["sampling_seed"], plan, fingerprint)

    def restore(directory: Path) -> None:
        nonlocal state
        adapter, optimizer, state = load_checkpoint(directory)
        if state.fingerprint != fingerprint:  # the driver checked; a stale Ray snapshot must not slip in
            raise ConfigError(f"{directory}: checkpoint of another DP-SGD config or privacy plan")
        engine.load_adapter_state(adapter)
        if sharded:
            engine.load_optimizer_state(optimizer)
        else:
            engine.optimizer.load_state_dict(optimizer)
        engine.step = state.step

    ckpt = ray.train.get_checkpoint()  # set when Ray restarted the worker group after a failure
    if ckpt is not None:
        with ckpt.as_directory() as d:
            restore(Path(d))
    elif loop_config.get("resume_dir"):
        restore(Path(loop_config["resume_dir"]))

    def report(st: TrainState, *, finished: bool = False) -> None:
        metrics = {"step": st.step, "finished": finished, "world_size": world,
                   "loss": st.history[-1]["loss"] if st.history else None}
        if sharded:  # gathering shards is a collective: every rank joins, rank 0 writes
            adapter, optimizer = engine.adapter_state(), engine.optimizer_state()
        else:
            adapter, optimizer = (engine.adapter_state(), engine.optimizer.state_dict()) if rank == 0 else (None, None)
        if rank != 0:
            if sharded and finished:
                engine.save_adapter(None)  # joins the gather; writes nothing off rank 0
            ray.train.report(metrics, checkpoint=None)
            return
        with tempfile.TemporaryDirectory() as tmp:
            write_checkpoint_files(Path(tmp), adapter, optimizer, st)
            if finished:
                engine.save_adapter(Path(tmp) / FINAL_ADAPTER_SUBDIR)
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(tmp),
                checkpoint_dir_name=f"checkpoint_step_{st.step:07d}{'_final' if finished else ''}",
            )

    finished = run_steps(engine, plan, state, config, on_checkpoint=report, progress=loop_config.get("progress", False),
                         is_main=rank == 0, epsilons=loop_config.get("epsilons"))
    if finished:
        report(state, finished=True)


def _use_gpu(config: DpSgdConfig) -> bool:
    import ray

    if config.device == "cuda":
        return True
    if config.device == "cpu":
        return False
    return ray.is_initialized() and ray.cluster_resources().get("GPU", 0) >= 1


def worker_request(config: DpSgdConfig, resources: StageResources | None) -> tuple[bool, dict | None]:
    """(use_gpu, resources_per_worker) of each Ray Train worker: the job's ``resources`` when given (a GPU
    asked for there, or by ``device: cuda``, is one per worker unless it says how many), else Train's default."""
    use_gpu = bool(resources is not None and resources.gpus) or _use_gpu(config)
    if resources is None:
        return use_gpu, None
    per_worker: dict = {"CPU": resources.cpus if resources.cpus is not None else 1}
    if use_gpu:
        per_worker["GPU"] = resources.gpus or 1
    if resources.memory_gb:
        per_worker["memory"] = int(resources.memory_gb * 1024**3)
    return use_gpu, per_worker


def run_dp_finetune(
    source: ExampleSource,
    config: DpSgdConfig,
    *,
    output_dir: Path,
    ledger=None,
    stage: str = "dpsgd",
    per_example_penalty=None,
    progress: bool = True,
    resume: bool = True,
    max_failures: int = 1,
    resources: StageResources | None = None,
) -> TrainResult:
    """DP-SGD LoRA on ``config.num_workers`` Ray Train workers; same outputs as ``train_dp_lora``
    (a ``dpsynth_core.dpsgd.trainer.DistributedRunner``: pass it as ``train_dp_lora(..., runner=)``).

    Only public values enter ``train_loop_config`` (the config, the plan, the source's description
    of where the data is); the secret sampling seed and the penalty go through the object store;
    each worker loads the examples from ``source`` itself.
    """
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if config.gpu_strategy == "fsdp2" and config.clipping != "ghost":
        raise ConfigError("field 'gpu_strategy': 'fsdp2' needs clipping: ghost (opacus ghost_fsdp)")
    if not is_shippable(source):
        raise ConfigError(
            f"num_workers > 1: the {source.describe()} would have to travel through Ray (task arguments, Train's "
            "run state); give train_dp_lora an ExampleSource that each worker loads from the data's source "
            "(dpsynth_core.dpsgd.sources: TableExampleSource, LoaderSource)"
        )
    output_dir = Path(output_dir).resolve()
    # the driver loads the data too: the unit count, the plan and ledger.check before any worker starts
    _, plan, fingerprint = prepare_stage(source, config, ledger=ledger, stage=stage)
    storage = output_dir / RAY_STORAGE_DIRNAME
    if not resume:
        shutil.rmtree(storage, ignore_errors=True)  # a fresh start leaves no old seed behind
    storage.mkdir(parents=True, exist_ok=True)
    os.chmod(storage, 0o700)  # its checkpoints hold the secret seed; Ray writes them with default modes
    resume_dir = latest_checkpoint(storage, plan, fingerprint) if resume else None
    resumed = TrainState.from_json((resume_dir / STATE_FILE).read_text()) if resume_dir else None
    sampling_seed = resumed.sampling_seed if resumed else new_sampling_seed(config)
    from ray_jobs.cluster import ensure_ray

    ensure_ray()  # join the cluster (RAY_ADDRESS / submitted job) or embed a local Ray
    use_gpu, per_worker = worker_request(config, resources)
    secret = ray.put({"sampling_seed": sampling_seed, "per_example_penalty": per_example_penalty})
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={
            "source": source,
            "config": config.model_dump(mode="json", exclude={"sampling_seed"}),
            "plan": plan.to_dict(),
            "secret": secret,
            "fingerprint": fingerprint,
            "resume_dir": str(resume_dir) if resume_dir else None,
            "progress": progress,
            # the plan's public epsilons, computed here once: the workers then need no accountant
            "epsilons": epsilon_schedule(plan, resumed.step if resumed else 0),
        },
        scaling_config=ScalingConfig(num_workers=config.num_workers, use_gpu=use_gpu, resources_per_worker=per_worker),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=RunConfig(
            name=_run_name(fingerprint),
            storage_path=str(storage),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )
    result = trainer.fit()
    if result.checkpoint is None:
        raise RuntimeError(f"Ray Train run under {storage} reported no checkpoint")
    with result.checkpoint.as_directory() as d:
        final = Path(d)
        state = TrainState.from_json((final / STATE_FILE).read_text(encoding="utf-8"))
        if state.step < config.steps:  # stop_after_steps (tests): not finished, nothing recorded
            return TrainResult(
                adapter_dir=final, steps=state.step, epsilon=plan.epsilon_after(state.step),
                noise_multiplier=plan.noise_multiplier, history=state.history,
                sampling_rate=plan.sampling_rate, delta=plan.delta, completed=False,
            )
        adapter_src = final / FINAL_ADAPTER_SUBDIR

        def write_adapter(target: Path) -> None:
            for f in adapter_src.iterdir():
                shutil.copy2(f, target / f.name)

        out = finalize_run(
            config=config, plan=plan, state=state, output_dir=output_dir, write_adapter=write_adapter,
            ledger=ledger, stage=stage, num_workers=config.num_workers,
        )
    shutil.rmtree(storage, ignore_errors=True)  # finished: nothing to resume, no seed left behind
    (output_dir / "ray_result.json").write_text(json.dumps({"world_size": config.num_workers, "steps": out.steps,
                                                            "epsilon": out.epsilon}), encoding="utf-8")
    return out
