"""`dpsynth audit dpsgd --config FILE`: a one-run canary audit of the DP-SGD generator.
`dpsynth audit release --config FILE`: a one-run canary audit of what a method releases (its synthetic data).

The config is a training config (``data:``, ``train:``) plus ``audit:`` (AuditSettings) and
``output_dir:``. The audit's private data are the training data and the canaries; its outputs
(which canaries were included, their scores) are owner-side reports, never a release.
"""

from __future__ import annotations

from pathlib import Path

import typer
from pydantic import Field

from dpsynth_core.audit.config import AuditSettings
from dpsynth_core.audit.release_settings import ReleaseAuditSettings
from dpsynth_core.config import StrictConfig
from dpsynth_core.dpsgd.config import DpSgdConfig
from dpsynth_core.dpsgd.train_job import TrainDataSpec
from dpsynth_core.errors import ConfigError

app = typer.Typer(help="Empirical privacy audits (owner-side).", no_args_is_help=True)


class AuditJobConfig(StrictConfig):
    data: TrainDataSpec
    train: DpSgdConfig
    audit: AuditSettings = Field(default_factory=AuditSettings)
    output_dir: str = "runs/audit"


VERDICTS = {"failed": "FAILED: the claim is refuted", "passed": "passed: the claim is not refuted",
            "inconclusive": "INCONCLUSIVE: this audit could not have failed"}


def false_alarm_line(result, what: str) -> str:
    """What the verdict's error rate is, and how to make an inconclusive audit able to fail."""
    return (f"false alarms: {what} that meets its claim is reported failed with probability at most "
            f"{1 - result.confidence:.0%}" + ("" if result.status != "inconclusive" else
                                             "; raise --canaries so the largest reachable bound exceeds the claim"))


@app.callback()
def _group() -> None:
    """Empirical privacy audits (owner-side)."""  # keeps `audit` a group of subcommands


@app.command()
def dpsgd(
    config: Path = typer.Option(..., "--config", "-c", help="YAML with data:, train: (DpSgdConfig), audit:, output_dir:."),
    canaries: int | None = typer.Option(None, "--canaries", help="Number of canaries m (overrides audit.canaries)."),
    out: Path | None = typer.Option(None, "--out", help="Report directory (overrides output_dir)."),
    progress: bool = typer.Option(False, "--progress/--no-progress"),
    allow_test_only: bool = typer.Option(False, "--allow-test-only", hidden=True,
                                         help="Permit audit.noise: off (not private; for tests)."),
) -> None:
    """Train the config's DP-SGD stage once with m canaries and report the epsilon lower bound at 95 %."""
    from dpsynth_core.audit import run_dpsgd_audit, write_audit_report
    from dpsynth_core.config import load_config
    from dpsynth_core.dpsgd.train_job import build_examples

    job = load_config(config, AuditJobConfig)
    settings = job.audit
    if canaries is not None:
        settings = AuditSettings.model_validate({**settings.model_dump(exclude_unset=True), "canaries": canaries})
    examples = build_examples(job.data, Path(config))
    if not examples:
        raise ConfigError(f"{config}: field 'data': no training records in {job.data.path}")
    try:
        result = run_dpsgd_audit(examples, job.train, settings, allow_test_only=allow_test_only, progress=progress)
    except ConfigError as exc:
        raise ConfigError(f"{config}: {exc}") from None
    summary, plot = write_audit_report(result, out or Path(job.output_dir))
    verdict = VERDICTS[result.status]
    typer.echo(
        f"epsilon lower bound {result.epsilon_lower_bound:.3f} ({result.confidence:.0%}) vs claimed "
        f"{result.claimed_epsilon:g} at delta {result.delta:.3g}: {verdict}; m={result.canaries}, "
        f"{result.correct}/{result.guesses} guesses right (all right would refute up to "
        f"{result.largest_reachable_bound:.3f}), sigma={result.noise_multiplier:.4g}, {result.wall_seconds:.0f} s"
    )
    typer.echo(false_alarm_line(result, "a mechanism"))
    if not result.private:
        typer.secho("NOT PRIVATE: noise was switched off (test-only mode)", fg="yellow")
    typer.echo(f"report: {summary}\nplot:   {plot}")


class ReleaseAuditJobConfig(StrictConfig):
    """``dpsynth audit release``'s file: the method, its config (a path next to this file, or inline),
    the audit's settings and where its summary goes."""

    method: str
    run: str | dict
    audit: ReleaseAuditSettings = Field(default_factory=ReleaseAuditSettings)
    output_dir: str = "runs/audit_release"


def load_release_audit(config: Path, canaries: int | None, mode: str | None = None):
    """(target, settings, output_dir) from a release-audit file; every error names the file."""
    import yaml

    from dpsynth.api.audit import release_target
    from dpsynth.api.methods import METHODS
    from dpsynth_core.config import load_config
    from dpsynth_core.config.paths import resolve_input_paths

    job = load_config(config, ReleaseAuditJobConfig)
    overrides = {k: v for k, v in (("canaries", canaries), ("mode", mode)) if v is not None}
    settings = ReleaseAuditSettings.model_validate({**job.audit.model_dump(exclude_unset=True), **overrides})
    if job.method not in METHODS:
        raise ConfigError(f"{config}: field 'method': one of {sorted(METHODS)}, not '{job.method}'")
    if isinstance(job.run, dict):
        raw = yaml.safe_load(Path(config).read_text(encoding="utf-8"))["run"]
        method_config = METHODS[job.method].from_dict(resolve_input_paths(raw, Path(config).parent)).config
    else:
        run_path = Path(job.run) if Path(job.run).is_absolute() else Path(config).parent / job.run
        if not run_path.is_file():
            run_path = Path(job.run)  # relative to the working directory, as `dpsynth run` takes it
        method_config = METHODS[job.method].from_yaml(run_path).config
    return release_target(job.method, method_config), settings, Path(job.output_dir)


@app.command()
def release(
    config: Path = typer.Option(..., "--config", "-c", help="YAML with method:, run: (the method's config, a path "
                                "or inline), audit: (ReleaseAuditSettings), output_dir:."),
    canaries: int | None = typer.Option(None, "--canaries", help="Number of canaries m (overrides audit.canaries)."),
    out: Path | None = typer.Option(None, "--out", help="Summary directory (overrides output_dir)."),
    mode: str | None = typer.Option(None, "--mode", hidden=True, help="dp, or test-only dp_off / broken_release."),
    allow_test_only: bool = typer.Option(False, "--allow-test-only", hidden=True,
                                         help="Permit audit.mode dp_off / broken_release (not private; for tests)."),
) -> None:
    """Run the config's method once with m canaries and attack its release/ only: the epsilon lower bound at 95 %."""
    import secrets

    from dpsynth_core.audit.release_run import run_release_audit, write_release_audit

    target, settings, output_dir = load_release_audit(config, canaries, mode)
    out_dir = out or output_dir
    work_dir = (out_dir / f".audit-run-{secrets.token_hex(4)}").resolve()  # the audit's own run (deleted afterwards)
    try:
        result = run_release_audit(target, settings, work_dir, allow_test_only=allow_test_only)
    except ConfigError as exc:
        raise ConfigError(f"{config}: {exc}") from None
    summary = write_release_audit(result, out_dir / "release_audit.json")
    audited = target.audited_run_dir()
    if audited is not None:  # a run of this same config: its report (`dpsynth report`) shows the bound
        typer.echo(f"also in the run of this config: {write_release_audit(result, audited / 'audit' / 'release_audit.json')}")
    verdict = VERDICTS[result.status]
    typer.echo(
        f"{result.method} release: epsilon lower bound {result.epsilon_lower_bound:.3f} ({result.confidence:.0%}) vs "
        f"claimed {result.claimed_epsilon:g} at delta {result.delta:.3g}: {verdict}; m={result.canaries}, "
        f"{result.reached} included canaries reached the mechanism (whole-file working set), "
        f"{result.correct}/{result.guesses} guesses right (all right would refute up to "
        f"{result.largest_reachable_bound:.3f}), {result.wall_seconds:.0f} s")
    typer.echo(false_alarm_line(result, "a pipeline"))
    if not result.ledger_private:
        typer.secho(f"NOT PRIVATE: test-only mode '{result.mode}'", fg="yellow")
    typer.echo(f"report: {summary} (the audit run's outputs are deleted; nothing of it is released)")
