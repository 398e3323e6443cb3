"""`dpsynth run aim`: the AIM baseline is a run of its own (one release, one ledger), not a second
full-epsilon release inside a DPFairLLM run (issue 12, Major 7)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from dpsynth_core.privacy import PrivacyLedger

ADULT_SCHEMA = Path(__file__).resolve().parent.parent / "configs" / "schemas" / "adult.yaml"


def test_aim_run_through_the_cli(tmp_path, adult_dir, monkeypatch, capsys):
    from dpsynth.cli.main import app

    cfg = {"name": "aim_t", "output_dir": str(tmp_path / "runs" / "aim_t"), "schema_path": str(ADULT_SCHEMA),
           "columns": ["capital_loss", "sex", "income"], "data": {"source": "adult", "train_rows": 150, "test_rows": 150},
           "epsilon": 2.0, "bins": 4, "num_rows": 40, "evaluate_privacy": False}
    path = tmp_path / "aim.json"
    path.write_text(json.dumps(cfg))

    def cli() -> None:
        monkeypatch.setattr(sys, "argv", ["dpsynth", "run", "aim", "--config", str(path)])
        try:
            app()
        except SystemExit as exc:
            assert exc.code in (0, None)

    cli()
    run = tmp_path / "runs" / "aim_t"
    ledger = PrivacyLedger.open(run)
    assert [e.stage for e in ledger.entries()] == ["dp_domain", "aim_baseline"]  # its own domain estimate
    assert ledger.total_epsilon() <= 2.0 + 1e-9
    assert [p.relative_to(run) for p in run.rglob("ledger.sqlite")] == [Path("ledger.sqlite")]
    manifest = json.loads((run / "release" / "MANIFEST.json").read_text())
    assert manifest["method"] == "aim" and set(manifest["files"]) >= {"synthetic.csv", "schema_resolved.json"}
    summary = json.loads((run / "stages" / "evaluate.done").read_text())
    assert summary["method"] == "aim" and 0.0 <= summary["tvd_1way"] <= 1.0
    # a rerun of the finished run says so and charges nothing
    capsys.readouterr()
    cli()
    assert "already finished" in capsys.readouterr().err
    assert len(PrivacyLedger.open(run).entries()) == 2
