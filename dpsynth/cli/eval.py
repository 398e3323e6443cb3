"""`dpsynth eval tabular|text`."""

from pathlib import Path

import typer

from dpsynth_core.errors import ConfigError

app = typer.Typer(help="Evaluate synthetic data against real data.", no_args_is_help=True)


@app.command()
def tabular(
    real_train: Path = typer.Option(..., "--real-train", help="Real training table (CSV/JSONL/Parquet)."),
    real_test: Path = typer.Option(..., "--real-test", help="Real test table (CSV/JSONL/Parquet)."),
    run: Path = typer.Option(None, "--run", help="A DPFairLLM run directory: its synthetic.csv and schema_resolved.json."),
    synthetic: Path = typer.Option(None, "--synthetic", help="Synthetic table (default: RUN/synthetic.csv)."),
    schema: Path = typer.Option(None, "--schema", help="Public schema YAML/JSON (default: RUN/schema_resolved.json)."),
    out: Path = typer.Option(Path("eval_tabular"), "--out", help="Output directory (report.json, PNGs)."),
) -> None:
    """Marginal TVD, TSTR (LR, gradient boosting), fairlearn gaps, DCR + membership inference.

    Only the synthetic table's columns are evaluated, so a full public schema works for a run that
    used a subset of its columns. The report reads real records: it is for the data owner, not a release.
    """
    import json

    from dpsynth_core.data import load_records
    from dpsynth_core.tabular.evaluate import evaluate_table
    from dpsynth_core.tabular.schema import load_schema

    if run is not None and not run.is_dir():
        raise ConfigError(f"--run {run}: not a directory")
    synthetic = synthetic or (run / "synthetic.csv" if run else None)
    schema = schema or (run / "schema_resolved.json" if run else None)
    if synthetic is None or schema is None:
        raise ConfigError("give --run RUN_DIR, or both --synthetic and --schema")
    synth = load_records(synthetic)
    s = load_schema(schema)
    used = [c for c in s.names if c in synth.columns]
    if not used:
        raise ConfigError(f"{synthetic}: none of its columns is in the schema {schema} (schema columns: {s.names})")
    s = s.select(used)
    unresolved = [c.name for c in s.columns if not c.resolved()]
    if unresolved:
        raise ConfigError(
            f"{schema}: columns {unresolved} have 'domain: dp' (bounds not public); evaluate with the run's "
            "DP-estimated schema instead: --run RUN_DIR or --schema RUN_DIR/schema_resolved.json"
        )
    def checked(frame, path: Path):  # the whole file; an error names it and the 1-based data row
        return s.validate_frame(frame, str(path))

    report = evaluate_table(checked(synth, synthetic), checked(load_records(real_train), real_train),
                            checked(load_records(real_test), real_test), s, out_dir=out)
    typer.echo(json.dumps({k: report[k] for k in ("n_synthetic", "tstr") if k in report}, indent=2))
    typer.echo(f"report: {out / 'report.json'}")
