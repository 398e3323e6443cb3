"""`dpsynth train --config FILE`: DP-SGD LoRA fine-tuning (in-process, or Ray Train for num_workers > 1).

A thin layer over the Python API (``dpsynth.api.Train``, the run loop's ``train`` method): the job's
config, data source and pre-flight are ``dpsynth_core.dpsgd.train_job``; everything that can be wrong
with a config fails there, before any training.
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="DP-SGD LoRA fine-tuning on Ray Train.", no_args_is_help=True)


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
    from rich.console import Console

    from dpsynth.api import Train
    from dpsynth_core.train.method import TrainStopped

    job = Train.from_yaml(config)
    if check:
        from dpsynth_core.dpsgd.train_job import preflight_train

        typer.echo(preflight_train(config, fresh=fresh).render())
        return
    console = Console()
    try:
        run = job.run(fresh=fresh, resume_checkpoint=resume, progress=progress)
    except TrainStopped as stopped:
        console.print(f"[yellow]{stopped}[/yellow]")
        return
    ledger = run.ledger
    out = Path(job.config.output_dir)
    console.print(f"[green]done[/green]: epsilon={ledger.epsilon:.4f} at delta={ledger.delta:.3g} of budget "
                  f"{ledger.budget:g}")
    console.print(f"adapter: {out / 'adapter'}\ncurve:   {out / 'training_curve.png'} (owner-only)\n"
                  f"release: {run.release_dir}")
    if (out / "merged").is_dir():
        console.print(f"merged:  {out / 'merged'}")
    for line in run.summary_lines():
        console.print(line, markup=False)
