"""`dpsynth eval tabular|text`."""

from pathlib import Path

import typer

app = typer.Typer(help="Evaluate synthetic data against real data.", no_args_is_help=True)


@app.command()
def tabular(
    synthetic: Path = typer.Option(..., "--synthetic", help="Synthetic table (CSV)."),
    real_train: Path = typer.Option(..., "--real-train", help="Real training table (CSV)."),
    real_test: Path = typer.Option(..., "--real-test", help="Real test table (CSV)."),
    schema: Path = typer.Option(..., "--schema", help="Public schema (YAML)."),
    out: Path = typer.Option(Path("eval_tabular"), "--out", help="Output directory (report.json, PNGs)."),
) -> None:
    """Marginal TVD, TSTR (LR, gradient boosting), fairlearn gaps, DCR + membership inference."""
    import json

    from dpsynth_core.data import load_records
    from dpsynth_core.tabular.evaluate import evaluate_table
    from dpsynth_core.tabular.schema import load_schema

    s = load_schema(schema)
    report = evaluate_table(load_records(synthetic), load_records(real_train), load_records(real_test), s, out_dir=out)
    typer.echo(json.dumps({k: report[k] for k in ("n_synthetic", "tstr") if k in report}, indent=2))
    typer.echo(f"report: {out / 'report.json'}")
