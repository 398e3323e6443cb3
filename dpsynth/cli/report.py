"""`dpsynth report RUN_DIR`: the data owner's report (report.html + report.json) and the release's cards."""

from __future__ import annotations

from pathlib import Path

import typer


def report(run_dir: Path = typer.Argument(..., help="A finished run directory (or a DP sweep's directory)."),
           baseline: Path | None = typer.Option(None, "--baseline", help="A finished AIM run on the same table "
                                                "(columns, target, test rows): its fairness gaps beside this run's.")
           ) -> None:
    """Write RUN_DIR/report.html and report.json (owner-side: they read real data) and add the dataset / model cards
    and the Parquet and Hugging Face exports to RUN_DIR/release/.

    Example: dpsynth report runs/actg_demo
    Example: dpsynth report runs/dpfair/dpfair_eps4_1000 --baseline runs/aim/aim_eps4
    """
    from dpsynth_core.report import write_report

    paths = write_report(run_dir, baseline=baseline)
    typer.echo(f"report: {paths['html']} (owner-side; also {paths['json'].name})\n"
               f"release: {paths['release']} (cards and exports added; publish this folder only)")


def report_after_run(run_dir: Path) -> str:
    """One line for the end of `dpsynth run`: where the report is, or why none was written (the run itself is
    done either way; `dpsynth report RUN_DIR` retries)."""
    from dpsynth_core.errors import DpsynthError
    from dpsynth_core.report import write_report

    try:
        return f"report: {write_report(run_dir)['html']} (owner-side)"
    except DpsynthError as exc:
        return f"report: not written ({exc})"
