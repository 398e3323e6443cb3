"""`dpsynth models list` through a pipe: every registry name printed in full (issue 19, item 8)."""

from __future__ import annotations

import subprocess
import sys

from dpsynth_core.models import list_models


def test_models_list_piped_prints_full_names():
    proc = subprocess.run([sys.executable, "-c", "from dpsynth.cli.main import app; app()", "models", "list"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {line.split("\t")[0] for line in proc.stdout.splitlines()}
    for spec in list_models():  # Rich's 80-column table cut 'smollm2-135m-instruct' to 'smollm2-135m-instr…'
        assert spec.name in names, proc.stdout
        assert spec.description in proc.stdout
