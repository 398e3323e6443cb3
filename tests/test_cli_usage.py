"""Usage errors print the usage and one line and exit 2 -- never a Python traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _dpsynth(*args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "dpsynth"  # the console script a user types
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,message", [
    (("nosuch",), "No such command 'nosuch'"),
    (("privacy", "epsilon", "--bogus"), "No such option: --bogus"),
    (("privacy", "epsilon", "--steps", "abc"), "Invalid value for '--steps'"),
    (("ledger", "show"), "Missing argument"),
])
def test_usage_errors_exit_2_with_usage_and_one_line(args, message):
    out = _dpsynth(*args)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr + out.stdout
    assert out.stderr.startswith("Usage: dpsynth") and f"Error: {message}" in out.stderr


def test_bare_command_shows_help_and_exits_2_and_version_exits_0():
    bare = _dpsynth()
    assert bare.returncode == 2 and "Traceback" not in bare.stderr + bare.stdout
    assert "Commands" in bare.stdout + bare.stderr
    version = _dpsynth("--version")
    assert version.returncode == 0 and version.stdout.startswith("dpsynth ")



def test_cli_starts_without_importing_torch():
    """Usage errors and --help answer at once: the CLI's entry imports no torch (seconds on 2 cores)."""
    import subprocess
    import sys

    code = "import sys, dpsynth.cli.main; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
