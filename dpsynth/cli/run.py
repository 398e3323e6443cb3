"""`dpsynth run actg|wasp|augpe|dpfair|aim --config FILE`: a thin layer over the Python API.

The pre-flight of the method (config and whole private file, nothing written), then
``METHODS[name].from_yaml(FILE).run(cluster="auto")`` (``dpsynth.api``): the method's Ray driver
(``ray_jobs/<name>.py``) on the run loop; the AIM baseline needs no Ray. Then the summary lines.
Imports are lazy so that `dpsynth --help` does not import Ray.
"""

from __future__ import annotations

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
    else:
        for note in plan.notes:
            typer.echo(note)
    return check


def _run(pipeline: str, config: Path, fresh: bool, check: bool) -> None:
    if _preflight(pipeline, config, check):
        return
    from dpsynth.api import METHODS

    from dpsynth.cli.report import report_after_run

    run = METHODS[pipeline].from_yaml(config).run(fresh=fresh, cluster="auto")
    for line in run.summary_lines():
        typer.echo(line)
    typer.echo(report_after_run(run.run_dir))  # the owner-side report and the release's cards


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
    _run("aim", config, fresh, check)
