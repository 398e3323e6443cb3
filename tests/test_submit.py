"""`dpsynth submit` without a cluster: the error line of a failed job, an unreachable address.
Submissions to a real (two-node) cluster are in tests/test_cluster.py."""

import subprocess
from pathlib import Path

from ray_cluster import BIN, free_port

from dpsynth.cli.jobs import build_runtime_env, error_line

REPO = Path(__file__).resolve().parent.parent


def test_error_line_is_the_last_error_of_the_logs():
    """What `dpsynth jobs logs/status` put first for a failed job: the final exception line of a
    traceback, or dpsynth's own one-line `error: ...`, not the Ray worker noise after it."""
    traceback = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                 "ValueError: When connecting to an existing cluster, num_cpus and num_gpus must not be provided\n"
                 "(raylet) [2026-11-23] worker exited\n")
    assert error_line(traceback) == ("ValueError: When connecting to an existing cluster, num_cpus and num_gpus "
                                     "must not be provided")
    assert error_line("loading\nerror: run_dir 'runs/x' is relative\n") == "error: run_dir 'runs/x' is relative"
    assert error_line("ray.exceptions.RayTaskError(KeyError): ray::f() boom\n").startswith("ray.exceptions.RayTaskError")
    assert error_line("all fine\n", "Job entrypoint command failed with exit code 1") == (
        "Job entrypoint command failed with exit code 1")


def test_submit_to_unreachable_cluster_is_a_clear_error():
    port = free_port()
    out = subprocess.run(
        [str(BIN / "dpsynth"), "submit", "--address", f"http://127.0.0.1:{port}", "--", "models", "list"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 2
    assert f"127.0.0.1:{port}" in out.stderr and "cannot reach" in out.stderr


def test_a_job_ships_every_package_of_the_project_but_no_run_directory():
    """The job's working_dir as Ray packs it: our excludes and the project's .gitignore, by Ray's own rules."""
    from ray._private.runtime_env.packaging import _get_excludes, get_excludes_from_ignore_files

    rules = [_get_excludes(REPO, build_runtime_env(REPO)["excludes"]),
             *get_excludes_from_ignore_files(REPO, include_gitignore=True)]
    excluded = lambda path: any(rule(path) for rule in rules)  # noqa: E731
    assert not excluded(REPO / "dpsynth_core" / "runs" / "lock.py") and not excluded(REPO / "dpsynth" / "cli")
    assert excluded(REPO / "runs" / "actg_demo" / "ledger.sqlite") and excluded(REPO / ".venv")
