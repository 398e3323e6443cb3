"""RUN_DIR/release/ holds only what may be published; `dpsynth release` copies only that, verified."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy import GaussianEvent, PrivacyLedger
from dpsynth_core.privacy.release_check import copy_release, verify_release
from dpsynth_core.runs.release import write_release


@pytest.fixture()
def finished_run(tmp_path):
    run = tmp_path / "run"
    ledger = PrivacyLedger.create(run, "toy", 4.0, 1e-5)
    ledger.record("hist", GaussianEvent(noise_multiplier=2.0, compositions=1))
    (run / "synthetic.csv").write_text("a,b\n1,2\n")
    (run / "adapter").mkdir()
    (run / "adapter" / "adapter_model.safetensors").write_bytes(b"\x00weights")
    (run / "metrics.json").write_text(json.dumps({"mauve_vs_private_heldout": 0.8}))  # owner-only
    (run / "checkpoint").mkdir()
    (run / "checkpoint" / "state.json").write_text(json.dumps({"sampling_seed": 123}))  # secret
    write_release(run, {"synthetic.csv": run / "synthetic.csv", "adapter": run / "adapter"}, ledger=ledger, method="toy")
    return run, ledger


def test_release_holds_dp_outputs_ledger_and_manifest_only(finished_run, tmp_path):
    run, ledger = finished_run
    manifest = verify_release(run)
    assert set(manifest["files"]) == {"synthetic.csv", "adapter/adapter_model.safetensors", "ledger.json", "ledger.txt"}
    assert manifest["epsilon"] == pytest.approx(ledger.total_epsilon()) and manifest["delta"] == 1e-5
    dest = tmp_path / "published"
    copy_release(run, dest)
    copied = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    assert copied == set(manifest["files"]) | {"MANIFEST.json"}
    assert "sampling_seed" not in "".join(p.read_text(errors="ignore") for p in dest.rglob("*") if p.is_file())


def test_a_not_private_run_releases_no_epsilon(tmp_path):
    """A reference run records no event: its manifest must not claim epsilon 0 (the strongest guarantee)."""
    run = tmp_path / "run"
    ledger = PrivacyLedger.create(run, "toy", 1e6, 1e-5)  # a nominal budget: the ledger requires a finite one
    ledger.mark_not_private("generator", "epsilon = inf: no noise")
    (run / "synthetic.csv").write_text("a,b\n1,2\n")
    write_release(run, {"synthetic.csv": run / "synthetic.csv"}, ledger=ledger, method="toy")
    manifest = verify_release(run)
    assert manifest["epsilon"] is None and manifest["not_private"]


def test_release_refuses_tampering_and_a_non_empty_destination(finished_run, tmp_path):
    run, _ = finished_run
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(ConfigError, match="not an empty directory"):
        copy_release(run, busy)
    (run / "release" / "synthetic.csv").write_text("a,b\n9,9\n")
    with pytest.raises(ConfigError, match="sha256"):
        copy_release(run, tmp_path / "out1")
    (run / "release" / "metrics.json").write_text("{}")
    with pytest.raises(ConfigError, match="extra"):
        verify_release(run)


def test_release_cli(finished_run, tmp_path):
    run, _ = finished_run
    dest = tmp_path / "cli_out"
    ok = subprocess.run([sys.executable, "-m", "dpsynth", "release", str(run), str(dest)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "released 4 files" in ok.stdout and (dest / "synthetic.csv").is_file()
    missing = subprocess.run([sys.executable, "-m", "dpsynth", "release", str(tmp_path / "nope"), str(tmp_path / "d2")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "no release" in missing.stderr
