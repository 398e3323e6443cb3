"""One-run canary audit (Steinke, Nasr & Jagielski 2023): the bound, and that the audit can fail."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsynth_core.audit import AuditSettings, epsilon_lower_bound, one_run_p_value, run_dpsgd_audit
from dpsynth_core.audit.canaries import draw_canaries
from dpsynth_core.audit.run import count_correct
from dpsynth_core.dpsgd import DpSgdConfig, TrainExample
from dpsynth_core.errors import ConfigError

torch.set_num_threads(2)


# --- the bound -------------------------------------------------------------------------------
# Reference values: jax-privacy 2.0.0 (`jax_privacy.auditing._epsilon_one_run`, DeepMind's
# implementation of the paper's Algorithm for (eps, delta)-DP) at 95 % confidence; and for
# delta = 0 the paper's Theorem in closed form: all r guesses right refutes eps while
# q^r < 0.05 with q = e^eps / (1 + e^eps), i.e. eps = logit(0.05 ** (1 / r)).
@pytest.mark.parametrize(
    "m, r, v, delta, expected",
    [
        (1000, 100, 100, 1e-5, 3.465376229),
        (1000, 1000, 1000, 1e-5, 5.782283132),
        (1000, 600, 600, 1e-5, 5.270399502),
        (1000, 200, 180, 1e-5, 1.796285071),
        (10000, 1000, 900, 1e-5, 2.015194452),
        (200, 100, 95, 1e-5, 2.170992329),
        (1000, 100, 100, 0.0, math.log(0.05 ** 0.01 / (1 - 0.05 ** 0.01))),
    ],
)
def test_bound_matches_reference_values(m, r, v, delta, expected):
    assert epsilon_lower_bound(m, r, v, delta, 0.95) == pytest.approx(expected, abs=2e-6)


def test_bound_is_zero_at_chance_and_monotone_in_correct_guesses():
    bounds = [epsilon_lower_bound(1000, 200, v, 1e-5) for v in range(90, 201, 5)]
    assert bounds[:3] == [0.0, 0.0, 0.0]  # ~half right (chance) refutes nothing
    assert all(b2 >= b1 for b1, b2 in zip(bounds, bounds[1:]))
    assert bounds[-1] > bounds[-3] > 0
    # more delta or more confidence can only weaken the claim the data refute
    assert epsilon_lower_bound(1000, 200, 190, 1e-3) < epsilon_lower_bound(1000, 200, 190, 1e-6)
    assert epsilon_lower_bound(1000, 200, 190, 1e-5, 0.99) < epsilon_lower_bound(1000, 200, 190, 1e-5, 0.95)


def test_p_value_at_the_bound_is_the_significance():
    eps = epsilon_lower_bound(500, 100, 90, 1e-5)
    assert one_run_p_value(500, 100, 90, eps, 1e-5) == pytest.approx(0.05, rel=1e-4)
    with pytest.raises(ValueError):
        one_run_p_value(10, 5, 6, 1.0, 1e-5)


def test_count_correct_guesses_top_in_and_bottom_out():
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    included = np.array([True, False, True, False, True, False])
    # top 2 called "in" (1 right), bottom 2 called "out" (index 4 wrong, 5 right)
    assert count_correct(scores, included, 2, 2) == 2
    assert count_correct(scores, included, 1, 1) == 2


def test_canaries_disjoint_and_inclusion_secret():
    from dpsynth_core.models import load_tokenizer

    tok = load_tokenizer("tiny-llama")
    data = [TrainExample("", "plain text")]
    a = draw_canaries(tok, 64, 4, data, np.random.default_rng())
    b = draw_canaries(tok, 64, 4, data, np.random.default_rng())
    assert len({e.target for e in a.examples}) == 64 and "plain text" not in {e.target for e in a.examples}
    assert 10 < a.included.sum() < 54
    assert a.included.tolist() != b.included.tolist()  # fresh entropy every time


# --- the audit on a real DP-SGD run ----------------------------------------------------------
DATA = [TrainExample("", f"note {i}") for i in range(20)]
# One config for both runs; only sigma differs. rdp: its calibration is the fastest here.
# 40 steps (each canary sampled ~8 times): with 15 steps at lr 0.1 the noise-off run memorised
# too little to refute eps = 0.5 in about 1 of 4 runs (32-46 of 50 right); with 40 at lr 0.05
# it made 49-50 of 50 right in 4 of 4 (bound 2.3-2.8), see the commit message.
CONFIG = DpSgdConfig(model="tiny-llama", epsilon=0.5, delta=1e-5, steps=40, expected_batch_size=24,
                     physical_batch_size=24, learning_rate=0.05, max_seq_len=16, device="cpu", accountant="rdp")
SETTINGS = dict(canaries=100, canary_tokens=4)  # guesses: 25 "in" + 25 "out"


def test_noise_off_is_refused_without_the_test_flag():
    with pytest.raises(ConfigError, match="test-only"):
        run_dpsgd_audit(DATA, CONFIG, AuditSettings(**SETTINGS, noise="off"))
    with pytest.raises(ConfigError, match="test knobs"):
        run_dpsgd_audit(DATA, CONFIG.model_copy(update={"sampling_seed": 1}), AuditSettings(**SETTINGS))


def test_audit_fails_with_noise_off(tmp_path):
    """Without noise the canaries are memorised: the bound refutes the epsilon sigma was calibrated for."""
    from dpsynth_core.audit import write_audit_report

    result = run_dpsgd_audit(DATA, CONFIG, AuditSettings(**SETTINGS, noise="off"), allow_test_only=True)
    assert result.noise_multiplier == 0.0 and not result.private
    assert result.epsilon_lower_bound > CONFIG.epsilon, result.to_summary()
    assert not result.passed
    summary, plot = write_audit_report(result, tmp_path)
    written = json.loads(summary.read_text())
    assert written["private"] is False and "NOT PRIVATE" in written["warning"]
    assert written["correct"] == result.correct and written["guesses"] == 50
    assert plot.stat().st_size > 10_000


def test_audit_passes_with_calibrated_noise():
    result = run_dpsgd_audit(DATA, CONFIG, AuditSettings(**SETTINGS))
    assert result.private and result.noise_multiplier > 1.0  # sigma calibrated for eps = 0.5
    assert result.claimed_epsilon == CONFIG.epsilon
    assert result.epsilon_lower_bound < CONFIG.epsilon, result.to_summary()
    assert result.passed


def test_cli_refuses_noise_off_without_flag_and_ships_valid_configs(tmp_path):
    from typer.testing import CliRunner

    from dpsynth_core.cli.audit import AuditJobConfig
    from dpsynth_core.cli.main import _app
    from dpsynth_core.config import load_config
    configs = Path(__file__).resolve().parent.parent / "configs"
    for name in ("audit_tiny.yaml", "audit_smollm2.yaml"):
        job = load_config(configs / name, AuditJobConfig)
        assert job.train.epsilon == 4.0 and job.audit.noise == "calibrated"
    (tmp_path / "d.csv").write_text("text\n" + "".join(f"row {i}\n" for i in range(30)), encoding="utf-8")
    (tmp_path / "a.yaml").write_text(
        f"data: {{path: {tmp_path / 'd.csv'}, text_column: text}}\n"
        "train: {model: tiny-llama, epsilon: 1.0, delta: 1.0e-5, steps: 2, expected_batch_size: 4}\n"
        "audit: {canaries: 8, noise: 'off'}\n",
        encoding="utf-8",
    )
    result = CliRunner().invoke(_app, ["audit", "dpsgd", "--config", str(tmp_path / "a.yaml"), "--out", str(tmp_path)])
    assert isinstance(result.exception, ConfigError) and "test-only" in str(result.exception)
    assert not (tmp_path / "audit.json").exists()
