"""`dpsynth eval tabular`: a full public schema works for a run on a subset of its columns; a
`domain: dp` column asks for the run's DP-estimated schema; exit 2 with a one-line error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ADULT_SCHEMA = Path(__file__).resolve().parent.parent / "configs" / "schemas" / "adult.yaml"
COLUMNS = ["age", "education", "sex", "hours_per_week", "income"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpsynth", "eval", "tabular", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def tables(tmp_path_factory, adult_dir):
    from dpsynth_core.data import load_adult

    d = tmp_path_factory.mktemp("eval")
    load_adult("train").sample(300, random_state=0).to_csv(d / "train.csv", index=False)
    load_adult("test").sample(300, random_state=1).to_csv(d / "test.csv", index=False)
    # a stand-in "synthetic" table on a subset of the schema's columns
    load_adult("train").sample(120, random_state=2)[COLUMNS].to_csv(d / "synthetic.csv", index=False)
    return d


def test_full_public_schema_evaluates_the_synthetic_columns(tables, tmp_path):
    res = _cli("--synthetic", str(tables / "synthetic.csv"), "--schema", str(ADULT_SCHEMA),
               "--real-train", str(tables / "train.csv"), "--real-test", str(tables / "test.csv"), "--out", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["n_synthetic"] == 120
    assert 0.5 < report["tstr"]["logreg"]["accuracy"] <= 1.0


def test_dp_domain_column_asks_for_the_runs_schema(tables, tmp_path):
    import pandas as pd

    synth = pd.read_csv(tables / "synthetic.csv")
    synth["capital_loss"] = 0
    synth.to_csv(tmp_path / "with_dp_col.csv", index=False)
    res = _cli("--synthetic", str(tmp_path / "with_dp_col.csv"), "--schema", str(ADULT_SCHEMA),
               "--real-train", str(tables / "train.csv"), "--real-test", str(tables / "test.csv"), "--out", str(tmp_path / "r"))
    assert res.returncode == 2
    assert "capital_loss" in res.stderr and "schema_resolved.json" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "r").exists()
    res = _cli("--real-train", str(tables / "train.csv"), "--real-test", str(tables / "test.csv"))
    assert res.returncode == 2 and "--run" in res.stderr
