"""`dpsynth privacy ...` and `dpsynth ledger show` from the shell."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from dpsynth.cli import ledger as ledger_cli
from dpsynth.cli import privacy as privacy_cli
from dpsynth_core.privacy import DpSgdEvent, PostProcessingEvent, PrivacyLedger, epsilon_dpsgd

REPO = Path(__file__).resolve().parent.parent
runner = CliRunner()


def test_privacy_epsilon_table():
    result = runner.invoke(
        privacy_cli.app,
        ["epsilon", "--sampling-rate", "0.01", "--noise-multiplier", "1.0", "--steps", "1000", "--delta", "1e-5"],
    )
    assert result.exit_code == 0, result.output
    figures = {m.group(1): float(m.group(2)) for m in re.finditer(r"(pld|rdp|prv)\s*│\s*([0-9.]+)", result.output)}
    assert set(figures) == {"pld", "rdp", "prv"}
    assert abs(figures["pld"] - 1.83) < 0.005 and abs(figures["rdp"] - 2.10) < 0.005
    assert abs(figures["prv"] - figures["pld"]) / figures["pld"] < 0.01


def test_privacy_calibrate_prints_sigma_and_achieved_epsilon():
    result = runner.invoke(
        privacy_cli.app,
        ["calibrate", "--epsilon", "3", "--delta", "1e-5", "--sampling-rate", "0.02", "--steps", "200", "-a", "rdp"],
    )
    assert result.exit_code == 0, result.output
    sigma = float(re.search(r"noise_multiplier: ([0-9.]+)", result.output).group(1))
    achieved = float(re.search(r"achieved epsilon: ([0-9.]+)", result.output).group(1))
    assert 2.97 <= achieved <= 3.0
    assert abs(epsilon_dpsgd(0.02, sigma, 200, 1e-5, "rdp") - achieved) < 5e-3  # sigma printed to 4 places


def test_ledger_show_table_and_json(tmp_path):
    ledger = PrivacyLedger.create(tmp_path, "biorxiv", 4.0, 1e-5)
    ledger.record("dpsgd", DpSgdEvent(noise_multiplier=1.2, sampling_rate=0.02, steps=100))
    ledger.record("generate", PostProcessingEvent())
    result = runner.invoke(ledger_cli.app, ["show", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "dpsgd" in result.output and "generate" in result.output
    assert f"{ledger.total_epsilon():.4f}" in result.output
    result = runner.invoke(ledger_cli.app, ["show", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["total_epsilon"] == ledger.total_epsilon()


def test_console_script_errors_are_one_red_line(tmp_path):
    exe = REPO / ".venv" / "bin" / "dpsynth"
    proc = subprocess.run([str(exe), "ledger", "show", str(tmp_path / "nowhere")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no privacy ledger" in proc.stderr
    proc = subprocess.run(
        [str(exe), "privacy", "epsilon", "-q", "1.5", "-s", "1", "-T", "10", "--delta", "1e-5"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and "sampling_rate must be in (0, 1]" in proc.stderr
