"""The ``dpsynth`` command line: one app, one sub-app per concern (see ``main.py``)."""

from dpsynth.cli.main import app, main

__all__ = ["app", "main"]
