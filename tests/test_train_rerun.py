"""`dpsynth train`: the rerun rule (finished -> say so, changed config -> refuse), the run lock, and
the budget reservation that refuses the loser of two concurrent runs before it trains."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from dpsynth.cli.train import app
from dpsynth_core.errors import BudgetExceededError, ConfigError
from dpsynth_core.privacy import PrivacyLedger
from dpsynth_core.runs.lock import RunLock, RunLockedError

REPO = Path(__file__).resolve().parent.parent
TRAIN = {"model": "tiny-llama", "steps": 1, "expected_batch_size": 4, "max_seq_len": 16,
         "device": "cpu", "torch_threads": 1}


def _config(tmp_path: Path, name: str, **over) -> Path:
    data = tmp_path / "d.csv"
    if not data.exists():
        pd.DataFrame({"text": [f"row {i} says something" for i in range(40)]}).to_csv(data, index=False)
    job = {"data": {"path": str(data), "text_col": "text"}, "privacy": {"epsilon": 2.0}, "train": dict(TRAIN),
           "output_dir": str(tmp_path / name)}
    for key, value in over.items():  # "privacy.epsilon" -> job["privacy"]["epsilon"]
        *parents, leaf = key.split(".")
        node = job
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _train(config: Path, *args: str):
    return CliRunner().invoke(app, ["--config", str(config), "--no-progress", *args])


def test_rerun_of_a_finished_train_does_nothing_and_a_changed_config_is_refused(tmp_path):
    config = _config(tmp_path, "run")
    out = tmp_path / "run"
    first = _train(config)
    assert first.exit_code == 0, first.output
    adapter = (out / "adapter" / "adapter_model.safetensors").read_bytes()

    again = _train(config)
    assert again.exit_code == 0, again.output
    assert "already finished" in again.output
    ledger = PrivacyLedger.open(out)
    assert [e.stage for e in ledger.entries()] == ["dpsgd"]  # no second event
    assert (out / "adapter" / "adapter_model.safetensors").read_bytes() == adapter  # not retrained

    saved = (out / "config.yaml").read_text()
    changed = _train(_config(tmp_path, "run", **{"privacy.epsilon": 1.0}))
    assert changed.exit_code != 0
    assert isinstance(changed.exception, ConfigError)
    assert "changed: privacy.epsilon" in str(changed.exception) and "--fresh" in str(changed.exception)
    assert (out / "config.yaml").read_text() == saved  # the run never claims the new epsilon

    fresh = _train(_config(tmp_path, "run", **{"privacy.epsilon": 1.0}), "--fresh")
    assert fresh.exit_code == 0, fresh.output  # not checked against the ledger it moves aside
    (aside,) = tmp_path.glob("run.prev-*")
    assert [e.stage for e in PrivacyLedger.open(aside).entries()] == ["dpsgd"]
    assert [e.epsilon for e in PrivacyLedger.open(out).entries()] == [pytest.approx(1.0, abs=0.01)]
    assert yaml.safe_load((out / "config.yaml").read_text())["privacy"]["epsilon"] == 1.0



def test_a_second_process_on_a_locked_run_is_refused_naming_the_holder(tmp_path):
    config = _config(tmp_path, "run")
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from dpsynth_core.runs.lock import RunLock
            with RunLock({str(tmp_path / 'run')!r}):
                print("held", flush=True)
                sys.stdin.readline()
            """)],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        result = _train(config)
    finally:
        holder.communicate("\n", timeout=60)
    assert isinstance(result.exception, RunLockedError), result.output
    assert str(tmp_path / "run") in str(result.exception) and f"pid {holder.pid}" in str(result.exception)
    assert not (tmp_path / "run" / "ledger.sqlite").exists()


HOLD_IN_TRAINING = """
    import sys
    from dpsynth_core.dpsgd import trainer
    from dpsynth.cli.train import app

    original = trainer.run_steps

    def paused(*args, **kwargs):  # run A is training: wait until the parent has tried run B
        print("training", flush=True)
        sys.stdin.readline()
        return original(*args, **kwargs)

    trainer.run_steps = paused
    app(["--config", sys.argv[1], "--no-progress"], standalone_mode=False)
    print("finished", flush=True)
"""


def test_the_loser_of_two_concurrent_runs_on_one_budget_is_refused_before_training(tmp_path, monkeypatch):
    """Runs A and B share a ledger whose budget holds one of them. A (another process) is training;
    B must be refused before its DP-SGD engine exists (the old code trained B fully, then refused)."""
    from dpsynth_core.dpsgd import engine

    shared = {"ledger.run_dir": str(tmp_path / "ledger"), "ledger.epsilon_budget": 2.2}
    run_a, run_b = _config(tmp_path, "a", **shared), _config(tmp_path, "b", **shared)
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLD_IN_TRAINING), str(run_a)], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    built = []
    monkeypatch.setattr(engine.DpSgdEngine, "__init__", lambda self, *a, **k: built.append(1) or pytest.fail("B trains"))
    try:
        assert proc.stdout.readline().strip() == "training", proc.stderr.read()
        result = _train(run_b)
    finally:
        out, err = proc.communicate("\n", timeout=300)
    assert proc.returncode == 0 and "finished" in out, err
    assert isinstance(result.exception, BudgetExceededError), result.output
    assert "reserved by stages still running: 'dpsgd'" in str(result.exception)
    assert built == [] and not (tmp_path / "b" / "adapter").exists()
    ledger = PrivacyLedger.open(tmp_path / "ledger")
    assert len(ledger.entries()) == 1 and ledger.reservations() == []  # A's reservation became its event
    with RunLock(tmp_path / "b"):  # B's lock was released when it was refused
        pass
