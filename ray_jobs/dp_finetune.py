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
  after it, so a resume neither double-counts nor drops steps.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dpsynth_core.dpsgd.budget import PrivacyPlan, plan_privacy
from dpsynth_core.dpsgd.checkpoint import STATE_FILE, TrainState, config_fingerprint, is_checkpoint, load_checkpoint, write_checkpoint_files
from dpsynth_core.dpsgd.config import DpSgdConfig, TrainExample, TrainResult
from dpsynth_core.dpsgd.trainer import finalize_run, new_sampling_seed

RAY_STORAGE_DIRNAME = "ray_train"
FINAL_ADAPTER_SUBDIR = "adapter"


def _run_name(fingerprint: str) -> str:
    return f"dp_finetune_{fingerprint}"


def latest_checkpoint(storage: Path, fingerprint: str) -> Path | None:
    """Newest complete checkpoint of this config under the Ray storage dir, or None."""
    best, best_step = None, -1
    for state_file in Path(storage).glob(f"{_run_name(fingerprint)}/*/{STATE_FILE}"):
        d = state_file.parent
        if not is_checkpoint(d):
            continue
        state = TrainState.from_json(state_file.read_text(encoding="utf-8"))
        if state.fingerprint == fingerprint and state.step > best_step:
            best, best_step = d, state.step
    return best


def _train_loop(loop_config: dict) -> None:
    """Runs on every Ray Train worker."""
    import ray.train
    import torch

    from dpsynth_core.dpsgd.engine import DistContext, DpSgdEngine, resolve_device
    from dpsynth_core.dpsgd.trainer import run_steps

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    config = DpSgdConfig.model_validate(loop_config["config"])
    plan = PrivacyPlan(**loop_config["plan"])
    torch.set_num_threads(config.torch_threads or 1)
    engine = DpSgdEngine(
        loop_config["examples"], config,
        noise_multiplier=plan.noise_multiplier, sampling_seed=loop_config["sampling_seed"],
        dist=DistContext(rank, world), device=resolve_device(config, ctx.get_local_rank()),
        per_example_penalty=loop_config.get("per_example_penalty"),
    )
    state = TrainState(0, loop_config["sampling_seed"], plan.noise_multiplier, plan.sampling_rate, plan.delta,
                       loop_config["fingerprint"], [])

    def restore(directory: Path) -> None:
        nonlocal state
        adapter, optimizer, state = load_checkpoint(directory)
        engine.load_adapter_state(adapter)
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
        if rank != 0:
            ray.train.report(metrics, checkpoint=None)
            return
        with tempfile.TemporaryDirectory() as tmp:
            write_checkpoint_files(Path(tmp), engine.adapter_state(), engine.optimizer.state_dict(), st)
            if finished:
                engine.save_adapter(Path(tmp) / FINAL_ADAPTER_SUBDIR)
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(tmp),
                checkpoint_dir_name=f"checkpoint_step_{st.step:07d}{'_final' if finished else ''}",
            )

    finished = run_steps(engine, plan, state, config, on_checkpoint=report, progress=loop_config.get("progress", False),
                         is_main=rank == 0)
    if finished:
        report(state, finished=True)


def _use_gpu(config: DpSgdConfig) -> bool:
    import ray

    if config.device == "cuda":
        return True
    if config.device == "cpu":
        return False
    return ray.is_initialized() and ray.cluster_resources().get("GPU", 0) >= 1


def run_dp_finetune(
    examples: Sequence[TrainExample],
    config: DpSgdConfig,
    *,
    output_dir: Path,
    ledger=None,
    stage: str = "dpsgd",
    per_example_penalty=None,
    progress: bool = True,
    resume: bool = True,
    max_failures: int = 1,
) -> TrainResult:
    """DP-SGD LoRA on ``config.num_workers`` Ray Train workers; same outputs as ``train_dp_lora``."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    examples = list(examples)
    output_dir = Path(output_dir).resolve()
    plan = plan_privacy(config, examples, ledger=ledger, stage=stage)  # ledger.check before any data moves
    fingerprint = config_fingerprint(config, plan.n_units)
    storage = output_dir / RAY_STORAGE_DIRNAME
    if not resume:
        shutil.rmtree(storage / _run_name(fingerprint), ignore_errors=True)
    resume_dir = latest_checkpoint(storage, fingerprint) if resume else None
    sampling_seed = (
        TrainState.from_json((resume_dir / STATE_FILE).read_text()).sampling_seed if resume_dir else new_sampling_seed(config)
    )
    if not ray.is_initialized():
        ray.init(include_dashboard=False, ignore_reinit_error=True)
    use_gpu = _use_gpu(config)
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={
            "examples": examples,
            "config": config.model_dump(mode="json"),
            "plan": plan.to_dict(),
            "sampling_seed": sampling_seed,
            "fingerprint": fingerprint,
            "resume_dir": str(resume_dir) if resume_dir else None,
            "per_example_penalty": per_example_penalty,
            "progress": progress,
        },
        scaling_config=ScalingConfig(num_workers=config.num_workers, use_gpu=use_gpu),
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
    shutil.rmtree(storage / _run_name(fingerprint), ignore_errors=True)  # finished: nothing to resume
    if storage.is_dir() and not any(storage.iterdir()):
        storage.rmdir()
    (output_dir / "ray_result.json").write_text(json.dumps({"world_size": config.num_workers, "steps": out.steps,
                                                            "epsilon": out.epsilon}), encoding="utf-8")
    return out
