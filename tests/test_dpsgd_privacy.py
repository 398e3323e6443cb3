"""DP-SGD privacy under attack (issue 12): resume accounting, secret randomness, test-only knobs,
nothing private (batch sizes, seeds) left on disk."""

from __future__ import annotations

import json

import pytest
import torch

from dpsynth_core.dpsgd import DpSgdConfig, TrainExample, train_dp_lora
from dpsynth_core.dpsgd.trainer import CHECKPOINT_DIRNAME
from dpsynth_core.errors import ConfigError

torch.set_num_threads(2)
EXAMPLES = [TrainExample(f"Topic {i % 3}:\n", f"text number {i} " * (1 + i % 4)) for i in range(32)]


def _cfg(**kw) -> DpSgdConfig:
    base = dict(model="tiny-llama", epsilon=2.0, delta=9e-3, steps=2, expected_batch_size=6, physical_batch_size=6,
                learning_rate=1e-2, device="cpu", max_seq_len=32)
    return DpSgdConfig(**{**base, **kw})


def _adapter(result) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(result.adapter_dir / "adapter_model.safetensors"))


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_resume_after_the_ledger_changed_is_refused_not_under_reported(tmp_path):
    """Major 4. Crash after 2 of 3 steps; another stage then spends from the ledger, so the re-plan
    raises sigma. Resuming would record the new sigma for ALL steps although 2 ran with less noise
    (an under-reported epsilon): the resume is refused, and the checkpoint with its seed deleted."""
    from dpsynth_core.privacy import PrivacyLedger, ZCdpEvent, epsilon_to_zcdp

    ledger = PrivacyLedger.create(tmp_path / "run", "toy", epsilon_budget=4.0, delta=9e-3)
    out = tmp_path / "out"
    cfg = dict(epsilon=2.7, steps=3, expected_batch_size=8, checkpoint_every=1)
    part = train_dp_lora(EXAMPLES, _cfg(**cfg, stop_after_steps=2), output_dir=out, ledger=ledger, progress=False)
    assert not part.completed and (out / CHECKPOINT_DIRNAME).is_dir()
    sigma_before = part.noise_multiplier

    ledger.record("aim", ZCdpEvent(rho=epsilon_to_zcdp(1.3, 9e-3)))  # the plan now needs more noise
    with pytest.raises(ConfigError, match="noise_multiplier") as info:
        train_dp_lora(EXAMPLES, _cfg(**cfg), output_dir=out, ledger=ledger, progress=False)
    assert repr(sigma_before) in str(info.value)
    assert [e.stage for e in ledger.entries()] == ["aim"]  # nothing recorded for the refused resume
    assert not (out / CHECKPOINT_DIRNAME).exists()  # the secret seed is not left behind
    # (the old code resumed here and recorded the raised sigma for all 3 steps, 2 of which ran at sigma_before)


def test_dp_randomness_is_secret_unless_a_test_pins_it(tmp_path):
    """Noise and Poisson sampling come from OS entropy, not from config.seed: two runs of one config
    give different adapters. The control (a pinned sampling_seed) shows nothing else differs."""
    from dpsynth_core.privacy import PrivacyLedger

    runs = {}
    for name, seed in (("a", None), ("b", None), ("pinned1", 5), ("pinned2", 5)):
        ledger = PrivacyLedger.create(tmp_path / f"run_{name}", "toy", 4.0, 9e-3)
        runs[name] = (train_dp_lora(EXAMPLES, _cfg(sampling_seed=seed, steps=1), output_dir=tmp_path / name, ledger=ledger,
                                    progress=False), ledger)
    assert _max_diff(_adapter(runs["pinned1"][0]), _adapter(runs["pinned2"][0])) < 1e-7
    assert _max_diff(_adapter(runs["a"][0]), _adapter(runs["b"][0])) > 1e-4
    # a pinned seed is a test-only knob: the ledger says so, everywhere its total is shown
    assert runs["a"][1].is_private and runs["b"][1].is_private
    pinned = runs["pinned1"][1]
    assert not pinned.is_private and pinned.to_dict()["private"] is False
    assert "NOT PRIVATE" in pinned.render() and "seed of Poisson sampling and noise is pinned" in pinned.render()
    summary = json.loads((runs["pinned1"][0].adapter_dir / "dp_training.json").read_text())
    assert summary["test_only_knobs"] and not json.loads(
        (runs["a"][0].adapter_dir / "dp_training.json").read_text())["test_only_knobs"]


def test_no_batch_sizes_or_stale_seed_on_disk(tmp_path):
    """Per-step Poisson batch sizes are private (un-noised): not in history.json nor in the
    checkpoint's state. A fresh restart (resume=False) deletes an old checkpoint before training."""
    out = tmp_path / "out"
    part = train_dp_lora(EXAMPLES, _cfg(stop_after_steps=1), output_dir=out, progress=False)
    state_file = out / CHECKPOINT_DIRNAME / "train_state.json"
    state = json.loads(state_file.read_text())
    assert not part.completed and state["history"]
    assert not [k for row in state["history"] for k in row if "batch" in k]
    old_seed = state["sampling_seed"]
    # a stray half-written checkpoint from a crash during save also holds the seed
    stray = out / f".{CHECKPOINT_DIRNAME}.tmp-crash"
    stray.mkdir()
    (stray / "train_state.json").write_text(state_file.read_text())

    done = train_dp_lora(EXAMPLES, _cfg(), output_dir=out, progress=False, resume=False)
    assert done.completed and done.steps == 2
    history = json.loads((out / "history.json").read_text())
    assert len(history) == 2 and not [k for row in history for k in row if "batch" in k]
    assert all(set(row) == {"step", "loss", "epsilon"} for row in done.history)
    leftover = [f for f in out.rglob("*") if f.is_file() and str(old_seed).encode() in f.read_bytes()]
    assert not leftover and not stray.exists() and not (out / CHECKPOINT_DIRNAME).exists()


def test_dpsynth_train_refuses_delta_not_below_one_over_n_before_creating_a_ledger(tmp_path):
    import pandas as pd
    import yaml
    from typer.testing import CliRunner

    from dpsynth.cli.train import app

    data = tmp_path / "d.csv"
    pd.DataFrame({"text": [f"row {i}" for i in range(20)]}).to_csv(data, index=False)
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"path": str(data), "text_column": "text"},
        "train": {"model": "tiny-llama", "epsilon": 1.0, "delta": 0.05, "steps": 1, "expected_batch_size": 4},
        "output_dir": str(tmp_path / "out"),
    }))
    result = CliRunner().invoke(app, ["--config", str(config), "--no-progress"])
    assert result.exit_code != 0
    assert "1/n" in str(result.exception) and "n = 20" not in str(result.exception)  # n itself is not stated
    assert not (tmp_path / "out" / "ledger.sqlite").exists()


def test_dpsynth_train_refuses_a_pinned_sampling_seed_outside_test_mode(tmp_path, monkeypatch):
    import yaml
    from typer.testing import CliRunner

    from dpsynth.cli.train import app

    monkeypatch.delenv("DPSYNTH_TEST_MODE", raising=False)
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"path": str(tmp_path / "absent.csv"), "text_column": "text"},
        "train": {"model": "tiny-llama", "epsilon": 1.0, "steps": 1, "sampling_seed": 7},
        "output_dir": str(tmp_path / "out"),
    }))
    result = CliRunner().invoke(app, ["--config", str(config), "--no-progress"])
    assert result.exit_code != 0 and "sampling_seed" in str(result.exception)
    assert not (tmp_path / "out").exists()


def test_sampling_rate_and_delta_come_from_the_public_size_of_a_secret_subsample():
    """A working set drawn by secret Bernoulli sampling has a private size: with public_num_units the
    plan's q = B / public size and the default delta do not depend on how many rows were drawn, so
    the ledger (q, delta) reveals nothing of the draw; without it they do."""
    from dpsynth_core.dpsgd.budget import plan_privacy

    def plan(n: int, **kw):
        return plan_privacy(_cfg(delta=None, expected_batch_size=8, **kw), EXAMPLES[:n])

    drawn_30, drawn_31 = plan(30, public_num_units=32), plan(31, public_num_units=32)
    assert drawn_30.sampling_rate == drawn_31.sampling_rate == 8 / 32
    assert drawn_30.delta == drawn_31.delta and drawn_30.noise_multiplier == drawn_31.noise_multiplier
    assert plan(30).sampling_rate != plan(31).sampling_rate  # the old behaviour: q = B / drawn size


def test_only_the_public_working_set_size_is_published(tmp_path):
    """A secret subsample's drawn size is private: the adapter's dp_training.json and the ledger entry
    state the public size m (``public_num_units``), never the number of rows drawn."""
    from dpsynth_core.privacy import PrivacyLedger

    ledger = PrivacyLedger.create(tmp_path, dataset="d", epsilon_budget=2.0, delta=9e-3)
    result = train_dp_lora(EXAMPLES[:29], _cfg(steps=1, public_num_units=32), output_dir=tmp_path / "out",
                           ledger=ledger, progress=False)
    summary = json.loads((result.adapter_dir / "dp_training.json").read_text())
    (entry,) = ledger.entries()
    assert summary["n_units"] == entry.details["n_units"] == 32  # not 29


def test_dpsynth_train_writes_a_release_without_the_owner_only_curve(tmp_path):
    import pandas as pd
    import yaml
    from typer.testing import CliRunner

    from dpsynth.cli.train import app
    from dpsynth_core.privacy.release_check import verify_release

    data = tmp_path / "d.csv"
    pd.DataFrame({"text": [f"row {i} says something" for i in range(40)]}).to_csv(data, index=False)
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"path": str(data), "text_column": "text"},
        "train": {"model": "tiny-llama", "epsilon": 2.0, "steps": 1, "expected_batch_size": 4, "max_seq_len": 16,
                  "device": "cpu"},
        "output_dir": str(tmp_path / "out"),
    }))
    result = CliRunner().invoke(app, ["--config", str(config), "--no-progress"])
    assert result.exit_code == 0, result.output
    released = set(verify_release(tmp_path / "out")["files"])
    assert "adapter/adapter_model.safetensors" in released and "ledger.json" in released
    assert not any("curve" in f or "history" in f for f in released)
