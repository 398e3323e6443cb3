"""`dpsynth run actg|wasp|augpe|dpfair|aim --config FILE`.

Each pipeline's driver lives in ``ray_jobs/<name>.py`` and exposes
``main(config_path: Path, resume: bool = True) -> Path`` returning the run directory. The AIM
baseline needs no Ray: its runner is ``dpsynth_core.tabular.aim_run``.
Imports are lazy so that `dpsynth --help` does not import Ray.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial
from pathlib import Path

import typer

from dpsynth_core.runs.preflight import Plan

app = typer.Typer(help="Run a synthesis pipeline end to end.", no_args_is_help=True)

@app.callback()
def _cluster(address: str | None = typer.Option(
        None, "--address", help="Ray cluster to join (e.g. 127.0.0.1:6379); default: $RAY_ADDRESS, else embedded.")):
    """`dpsynth run --address HOST:PORT <pipeline> ...` joins that cluster (the drivers read RAY_ADDRESS)."""
    if address:
        import os

        os.environ["RAY_ADDRESS"] = address


_CONFIG = typer.Option(..., "--config", "-c", help="Pipeline config (YAML).", exists=False)
_FRESH = typer.Option(False, "--fresh", help="Ignore completed stages and start over in a new run directory.")
_CHECK = typer.Option(False, "--check", help="Only the pre-flight: validate config and data, print what would run, "
                                            "write nothing.")


def method_preflight(pipeline: str) -> Callable[[Path], Plan]:
    """The pre-flight of ``pipeline``: one function per method, living with it (``runs.preflight``)."""
    if pipeline == "actg":
        from dpsynth_core.actg.preflight import preflight_actg

        return preflight_actg
    if pipeline in ("wasp", "augpe"):
        from dpsynth_core.pe.preflight import preflight_pe

        return partial(preflight_pe, method=pipeline)
    from dpsynth_core.tabular.preflight import preflight_aim, preflight_dpfair

    return {"dpfair": preflight_dpfair, "aim": preflight_aim}[pipeline]


def _preflight(pipeline: str, config: Path, check: bool) -> bool:
    """Config and whole data file checked before a run directory or Ray exists; True: stop here (--check)."""
    plan = method_preflight(pipeline)(Path(config))
    if check:
        typer.echo(plan.render())
    return check


def _run(pipeline: str, config: Path, fresh: bool, check: bool) -> None:
    if _preflight(pipeline, config, check):
        return
    from dpsynth.cli.run_summary import now

    started = now()
    driver = importlib.import_module(f"ray_jobs.{pipeline}")
    _summarize(driver.main(config, resume=not fresh), started)


def _summarize(run_dir: Path, started: float) -> None:
    """End with where the outputs are, epsilon spent of the budget, stages run/skipped."""
    from dpsynth.cli.run_summary import summary_lines

    from dpsynth.cli.report import report_after_run

    for line in summary_lines(run_dir, started):
        typer.echo(line)
    typer.echo(report_after_run(run_dir))  # the lead moves this into the one run loop at merge


@app.command()
def actg(config: Path = _CONFIG, fresh: bool = _FRESH, check: bool = _CHECK) -> None:
    """ACTG-ARL: attributes -> AIM features -> DP conditional generator -> Best-of-N -> Anchored RL."""
    _run("actg", config, fresh, check)


@app.command()
def wasp(config: Path = _CONFIG, fresh: bool = _FRESH, check: bool = _CHECK) -> None:
    """WASP: several PLMs, Top-Q DP voting, contrastive prompts, PLM re-weighting."""
    _run("wasp", config, fresh, check)


@app.command()
def augpe(config: Path = _CONFIG, fresh: bool = _FRESH, check: bool = _CHECK) -> None:
    """Aug-PE: private evolution with one PLM and a nearest-neighbour DP histogram."""
    _run("augpe", config, fresh, check)


@app.command()
def dpfair(config: Path = _CONFIG, fresh: bool = _FRESH, check: bool = _CHECK) -> None:
    """DPFairLLM: DP and fair tabular synthesis with a fine-tuned LLM."""
    _run("dpfair", config, fresh, check)


@app.command()
def aim(config: Path = _CONFIG, fresh: bool = _FRESH, check: bool = _CHECK) -> None:
    """AIM baseline (smartnoise-synth) on a table: its own run, release and ledger."""
    if _preflight("aim", config, check):
        return
    from dpsynth.cli.run_summary import now
    from dpsynth_core.tabular.aim_run import main

    started = now()
    _summarize(main(config, resume=not fresh), started)
