"""`dpsynth train --config FILE`: DP-SGD LoRA fine-tuning (in-process, or Ray Train for num_workers > 1).

The job's config, data source, ledger and pre-flight are ``dpsynth_core.dpsgd.train_job``: everything
that can be wrong with a config fails there, before any training.
"""

from __future__ import annotations

from pathlib import Path

import typer

from dpsynth_core.dpsgd.sources import TableExampleSource
from dpsynth_core.dpsgd.train_job import (
    EXECUTION_ONLY,
    TrainJobConfig,
    data_source,
    open_ledger,
    preflight_train,
)
from dpsynth_core.errors import ConfigError
from dpsynth_core.runs import StageMarkers, announce_finished, open_run_dir, refuse_changed_config
from dpsynth_core.runs.lock import RunLock

app = typer.Typer(help="DP-SGD LoRA fine-tuning on Ray Train.", no_args_is_help=True)


def already_finished(root: Path, snapshot: dict, stage: str) -> bool:
    """The rerun rule (runs/run_dir.py): another config in ``root`` is refused, naming the changed keys; a
    finished run says so (True) and is not trained again."""
    if refuse_changed_config(root, snapshot, EXECUTION_ONLY) and StageMarkers(root).done(stage):
        announce_finished(root)
        return True
    return False


@app.callback(invoke_without_command=True)
def train(
    config: Path = typer.Option(..., "--config", "-c", help="YAML with data:, train: (DpSgdConfig), output_dir:, ledger:."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue from output_dir/checkpoint if present."),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
    fresh: bool = typer.Option(False, "--fresh", help="Move an old run in output_dir aside (NAME.prev-STAMP) and "
                                                     "start again; without it a finished run is not retrained."),
    check: bool = typer.Option(False, "--check", help="Only the pre-flight: validate config and data, print the plan, "
                                                     "write nothing."),
) -> None:
    """Fine-tune a LoRA adapter with DP-SGD; writes adapter/, training_curve.png and a ledger entry.

    A finished run is not trained again (it says so); another config in output_dir is refused
    (--fresh moves the old run aside); one process per output_dir (a lock)."""
    from dpsynth_core.config import load_config
    from dpsynth_core.dpsgd.sampling import PrivacyUnits
    from dpsynth_core.privacy.randomness import refuse_pinned_dp_seed

    job = load_config(config, TrainJobConfig)
    if not (fresh or check) and already_finished(Path(job.output_dir), job.model_dump(mode="json"), job.stage):
        return  # the rerun rule comes first: a finished run reads no data and is not checked against its own spend
    plan = preflight_train(config, fresh=fresh)  # config, whole data file, delta, noise: before anything is written
    if check:
        typer.echo(plan.render())
        return
    try:  # a pinned seed makes the noise reproducible from this file: tests only (DPSYNTH_TEST_MODE=1)
        refuse_pinned_dp_seed("train.sampling_seed", job.train.sampling_seed)
    except ValueError as exc:
        raise ConfigError(f"{config}: {exc}") from None
    source = data_source(job.data, Path(config))
    examples = source.load()
    if not examples:
        raise ConfigError(f"{config}: field 'data': no training records in {job.data.path}")
    n_units = len(PrivacyUnits.from_user_ids([e.user_id for e in examples]))
    root, snapshot = Path(job.output_dir), job.model_dump(mode="json")
    with RunLock(root):  # one process per run, from here to the end (RunLockedError names the holder)
        open_run_dir(root, snapshot, resume=not fresh, ignore=EXECUTION_ONLY)
        if StageMarkers(root).done(job.stage):  # finished by another process while this one read its data
            announce_finished(root)
            return
        run_training(job, config, source, examples, n_units, resume=resume, progress=progress)


def run_training(job: TrainJobConfig, config: Path, source: TableExampleSource, examples: list, n_units: int, *,
                 resume: bool, progress: bool) -> None:
    """Plan and check the budget, train, record, release; the stage marker last (the rerun rule)."""
    from rich.console import Console

    from dpsynth_core.dpsgd import train_dp_lora
    from dpsynth_core.dpsgd.budget import plan_privacy

    try:
        ledger = open_ledger(job, n_units)
        plan_privacy(job.train, examples, ledger=ledger, stage=job.stage)  # every check, before training
    except ConfigError as exc:
        raise ConfigError(f"{config}: {exc}") from None
    runner = None
    if job.train.num_workers > 1:  # the CLI is the driver: it hands the engine the Ray Train runner
        from ray_jobs.dp_finetune import run_dp_finetune as runner
    # in-process: the examples already read; on Ray: the source, which each worker loads itself
    result = train_dp_lora(examples if runner is None else source, job.train, output_dir=Path(job.output_dir),
                           ledger=ledger, stage=job.stage, progress=progress, resume=resume, runner=runner)
    console = Console()
    if not result.completed:
        console.print(f"[yellow]stopped after {result.steps} steps (stop_after_steps); rerun to resume[/yellow]")
        return
    console.print(
        f"[green]done[/green]: {result.steps} steps, epsilon={result.epsilon:.4f} at delta={result.delta:.3g} "
        f"(noise multiplier {result.noise_multiplier:.4f}, sampling rate {result.sampling_rate:.4g})"
    )
    from dpsynth_core.runs.release import write_release

    # Publishable: the adapter (with its privacy summary) and the ledger; the loss curve is owner-only.
    items = {"adapter": result.adapter_dir, **({"merged": result.merged_dir} if result.merged_dir else {})}
    release = write_release(ledger.path.parent, items, ledger=ledger, method="dp-sgd lora")
    console.print(f"adapter: {result.adapter_dir}\ncurve:   {result.curve_png} (owner-only)\nrelease: {release}")
    if result.merged_dir:
        console.print(f"merged:  {result.merged_dir}")
    console.print(ledger.render())
    StageMarkers(Path(job.output_dir)).mark(job.stage, {"steps": result.steps, "epsilon": result.epsilon})
