"""Run the ``dpsynth`` console entry inside the test process (shared by the CLI tests)."""

from __future__ import annotations

import sys


def dpsynth(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """Run the `dpsynth` console entry in this process: (exit code, stdout + stderr)."""
    from dpsynth.cli.main import app

    monkeypatch.setattr(sys, "argv", ["dpsynth", *args])
    code = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out + out.err
