"""`dpsynth submit -- <subcommand ...>`, `dpsynth jobs list|status|logs|stop`, `dpsynth tune --config FILE`.

Jobs go through Ray's job submission API (the dashboard address of a cluster head, e.g.
``http://127.0.0.1:8265`` or the address printed by ``ray up cluster.yaml``). The job's
entrypoint is ``python -m dpsynth <subcommand ...>`` run in the cluster's environment, where
cluster.yaml's setup commands installed the project; the local project directory travels as
the job's ``working_dir`` (configs, schemas) without .venv, runs or .git.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
import time
from pathlib import Path

import typer

from dpsynth_core.errors import ConfigError

app = typer.Typer(help="Jobs on a Ray cluster: list, status, logs, stop.", no_args_is_help=True)

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
_ADDRESS = typer.Option(
    None, "--address", "-a",
    help=f"Ray dashboard / job-submission address (default: $RAY_ADDRESS or {DEFAULT_ADDRESS}).",
)
# gitignore-style patterns: "/runs" is the project's run directories only, not the package dpsynth_core/runs/
_EXCLUDES = [".venv", ".git", "/runs", "**/__pycache__", "*.safetensors", ".pytest_cache", ".whl", ".gl"]


def _client(address: str | None):
    from ray.job_submission import JobSubmissionClient

    address = address or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS
    if address.startswith("ray://"):
        raise ConfigError(f"{address}: job submission needs the dashboard address (http://HOST:8265), not ray://")
    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # connection refused, bad URL, version mismatch
        raise ConfigError(f"cannot reach a Ray cluster at {address}: {exc}") from None


def build_runtime_env(working_dir: Path, env_vars: dict[str, str] | None = None) -> dict:
    """The runtime_env a dpsynth job runs with: the project dir (configs, schemas) as working_dir."""
    if not working_dir.is_dir():
        raise ConfigError(f"{working_dir}: working directory not found")
    return {
        "working_dir": str(working_dir),
        "excludes": list(_EXCLUDES),
        "env_vars": {"PYTHONUNBUFFERED": "1", **(env_vars or {})},
    }


def submit(
    args: list[str] = typer.Argument(..., help="The dpsynth subcommand to run on the cluster, after `--`."),
    address: str | None = _ADDRESS,
    working_dir: Path = typer.Option(Path("."), "--working-dir", help="Project directory shipped with the job."),
    num_gpus: float = typer.Option(0, "--num-gpus", help="GPUs reserved for the job's driver."),
    env: list[str] = typer.Option([], "--env", help="KEY=VALUE environment variables for the job (repeatable)."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Follow the job's logs until it ends."),
) -> None:
    """Submit `dpsynth <args...>` as a Ray job, e.g. `dpsynth submit -- run actg --config configs/actg_demo.yaml`."""
    env_vars = {}
    for item in env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env {item!r}: expected KEY=VALUE")
        env_vars[key] = value
    logging.getLogger("ray").setLevel(logging.ERROR)  # no INFO lines about packaging the working dir
    client = _client(address)
    entrypoint = "python -m dpsynth " + " ".join(shlex.quote(a) for a in args)
    job_id = _submit_with_retry(
        client,
        entrypoint=entrypoint,
        runtime_env=build_runtime_env(working_dir.resolve(), env_vars),
        entrypoint_num_gpus=num_gpus or None,
        metadata={"submitted_by": "dpsynth"},
    )
    typer.echo(f"submitted {job_id}: {entrypoint}")
    if not wait:  # the id is the handle: `dpsynth jobs logs ID --follow`, `dpsynth jobs status ID`
        typer.echo(f"follow it with: dpsynth jobs logs {job_id} --follow" + (f" --address {address}" if address else ""))
        return
    _finish(client, job_id, _follow(client, job_id))


def _submit_with_retry(client, attempts: int = 30, wait_s: float = 2.0, **job) -> str:
    """A head that has just started answers 500 "No available agent" until its job agent is up:
    retry that answer for about a minute; any other error is raised at once."""
    for attempt in range(attempts):
        try:
            return client.submit_job(**job)
        except RuntimeError as err:
            if "No available agent" not in str(err) or attempt == attempts - 1:
                raise
            typer.echo(f"the cluster's job agent is not up yet; retrying in {wait_s:.0f}s", err=True)
            time.sleep(wait_s)
    raise AssertionError("unreachable")


ERROR_LINE = re.compile(r"^(error: .+|([A-Za-z_][\w.]*)?(Error|Exception|Exit|Interrupt|Failure)\b(\(.*\))?(: .*)?)$")


def error_line(logs: str, fallback: str | None = None) -> str | None:
    """The line that says why a job failed: the last ``error: ...`` (dpsynth's one-line errors) or
    exception line (the end of a Python traceback) of its logs, else ``fallback`` (Ray's message)."""
    for line in reversed(logs.splitlines()):
        line = line.strip()
        if ERROR_LINE.match(line):
            return line
    return fallback


def _failure(client, job_id: str, logs: str | None = None) -> str:
    info = client.get_job_info(job_id)
    logs = client.get_job_logs(job_id) if logs is None else logs
    message = (info.message or "").strip().splitlines()
    return error_line(logs, message[0] if message else None) or "no error line in the job's logs"


def _finish(client, job_id: str, status: str) -> None:
    """After following a job: its final status; a failed job's error line (stderr) and exit status 1."""
    if status == "SUCCEEDED":
        typer.echo(f"{job_id}: {status}")
        return
    typer.echo(f"{job_id}: {status}: {_failure(client, job_id)}", err=True)
    sys.exit(1)  # not typer.Exit: the CLI runs click in non-standalone mode, which returns its code as 0


def _status(client, job_id: str) -> str:
    return str(client.get_job_status(job_id)).split(".")[-1]


def _follow(client, job_id: str, poll_s: float = 1.0) -> str:
    printed = 0
    while True:
        status = _status(client, job_id)
        logs = client.get_job_logs(job_id)
        if len(logs) > printed:
            typer.echo(logs[printed:], nl=False)
            printed = len(logs)
        if status in {"SUCCEEDED", "FAILED", "STOPPED"}:
            return status
        time.sleep(poll_s)


@app.command("list")
def list_jobs(address: str | None = _ADDRESS) -> None:
    """List the cluster's jobs."""
    for job in _client(address).list_jobs():
        typer.echo(f"{job.submission_id}\t{str(job.status).split('.')[-1]}\t{job.entrypoint}")


@app.command()
def status(job_id: str, address: str | None = _ADDRESS) -> None:
    """Print a job's status (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED); a failed job's error line follows."""
    client = _client(address)
    state = _status(client, job_id)
    typer.echo(state)
    if state == "FAILED":
        typer.echo(f"error line: {_failure(client, job_id)}")


@app.command()
def logs(job_id: str, address: str | None = _ADDRESS, follow: bool = typer.Option(False, "--follow", "-f")) -> None:
    """Print a job's logs; with --follow, stream them until the job ends. A failed job's error line
    comes first (after the stream when following), then the traceback; the exit status is 1."""
    client = _client(address)
    if follow:
        _finish(client, job_id, _follow(client, job_id))
        return
    text = client.get_job_logs(job_id)
    failed = _status(client, job_id) == "FAILED"
    if failed:
        typer.echo(f"{job_id}: FAILED: {_failure(client, job_id, text)}", err=True)
    typer.echo(text, nl=False)
    if failed:
        sys.exit(1)


@app.command()
def stop(job_id: str, address: str | None = _ADDRESS) -> None:
    """Stop a running job."""
    typer.echo("stopped" if _client(address).stop_job(job_id) else "not running")


def register_top_level(root: typer.Typer) -> None:
    """Add the top-level `submit`, `tune` and `generate` commands."""
    root.command(
        "submit",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(submit)
    from dpsynth.cli.generate import generate
    from dpsynth.cli.tune import tune

    root.command("tune")(tune)
    root.command("generate")(generate)
