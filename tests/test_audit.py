"""One-run canary audit (Steinke, Nasr & Jagielski 2023): the bound, and that the audit can fail."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dpsynth_core.audit import AuditSettings, epsilon_lower_bound, one_run_p_value, run_dpsgd_audit
from dpsynth_core.audit.canaries import draw_canaries
from dpsynth_core.audit.run import count_correct
from dpsynth_core.dpsgd import DpSgdConfig, TrainExample
from dpsynth_core.errors import ConfigError


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
# 40 steps at lr 0.05 (each canary sampled ~8 times): the noise-off run memorises the included
# canaries. m = 200 with 50 + 50 guesses can refute up to 3.47 at delta = 1e-5, above the claimed 1.
CONFIG = DpSgdConfig(model="tiny-llama", epsilon=1.0, delta=1e-5, steps=40, expected_batch_size=24,
                     physical_batch_size=24, learning_rate=0.05, max_seq_len=16, device="cpu", accountant="rdp")
SETTINGS = dict(canaries=200, canary_tokens=4)  # guesses: 50 "in" + 50 "out"


def test_noise_off_is_refused_without_the_test_flag():
    with pytest.raises(ConfigError, match="test-only"):
        run_dpsgd_audit(DATA, CONFIG, AuditSettings(**SETTINGS, noise="off"))
    with pytest.raises(ConfigError, match="test knobs"):
        run_dpsgd_audit(DATA, CONFIG.model_copy(update={"sampling_seed": 1}), AuditSettings(**SETTINGS))


def test_audit_fails_with_noise_off(tmp_path):
    """Without noise the canaries are memorised: the bound refutes the claimed epsilon = 1, and the
    report says `failed`, with its false-alarm rate and no bound picked after looking."""
    from dpsynth_core.audit import write_audit_report

    result = run_dpsgd_audit(DATA, CONFIG, AuditSettings(**SETTINGS, noise="off"), allow_test_only=True)
    assert result.noise_multiplier == 0.0 and not result.private
    assert result.largest_reachable_bound == pytest.approx(3.47, abs=0.03) and 3.44 > CONFIG.epsilon
    assert result.epsilon_lower_bound > CONFIG.epsilon, result.to_summary()
    assert result.status == "failed" and not result.passed
    summary, plot = write_audit_report(result, tmp_path)
    written = json.loads(summary.read_text())
    assert written["status"] == "failed" and written["false_alarm_rate"] == pytest.approx(0.05)
    assert "passed" not in written and "guesses_by_count" not in written  # its maximum is not a valid bound
    assert written["private"] is False and "NOT PRIVATE" in written["warning"]
    assert written["correct"] == result.correct and written["guesses"] == 100
    assert plot.stat().st_size > 10_000


def test_audit_passes_with_calibrated_noise():
    result = run_dpsgd_audit(DATA, CONFIG, AuditSettings(**SETTINGS))
    assert result.private and result.noise_multiplier > 1.0  # sigma calibrated for eps = 1
    assert result.claimed_epsilon == CONFIG.epsilon
    assert result.epsilon_lower_bound < CONFIG.epsilon, result.to_summary()
    assert result.status == "passed"


def test_an_audit_that_cannot_fail_is_inconclusive_and_shipped_configs_can_fail():
    """The old shipped configs (epsilon 4, m = 100) could reach at most 2.78: `inconclusive`, never
    `passed`, whatever the run found. m = 1,000 (the default) reaches 5.09 at delta = 1e-5."""
    from dpsynth_core.audit import audit_status, largest_reachable_bound
    from dpsynth.cli.audit import AuditJobConfig
    from dpsynth_core.config import load_config

    reach_100 = largest_reachable_bound(100, 50, 1e-5)
    assert reach_100 == pytest.approx(2.78, abs=0.01)
    assert audit_status(reach_100, 4.0, reach_100) == "inconclusive"  # even with every guess right
    assert audit_status(4.5, 4.0, reach_100) == "failed" and audit_status(1.0, 0.5, reach_100) == "failed"
    settings = AuditSettings()
    assert settings.canaries >= 1000
    assert largest_reachable_bound(settings.canaries, settings.k_in + settings.k_out, 1e-5) == pytest.approx(
        5.09, abs=0.01)
    for name in ("audit_tiny.yaml", "audit_smollm2.yaml"):
        job = load_config(Path(__file__).resolve().parent.parent / "configs" / name, AuditJobConfig)
        reach = largest_reachable_bound(job.audit.canaries, job.audit.k_in + job.audit.k_out, job.train.delta)
        assert reach > job.train.epsilon, name


def test_sigma_and_q_come_from_the_public_size_before_any_canary_is_drawn(monkeypatch):
    """The number of canaries included is secret: the audited mechanism's q and sigma are fixed from
    records + m/2 before the draw (they used to be calibrated on the drawn training set)."""
    import dpsynth_core.audit.run as audit_run

    import dpsynth_core.dpsgd.budget as budget

    calls = []

    real_plan = budget.plan_privacy

    def recording_plan(config, examples, **kw):
        calls.append(("plan", config.public_num_units, len(examples)))
        return real_plan(config, examples, **kw)

    class Drawn(Exception):
        pass

    def stop_at_draw(*args, **kwargs):
        calls.append(("draw",))
        raise Drawn

    monkeypatch.setattr(budget, "plan_privacy", recording_plan)
    monkeypatch.setattr(audit_run, "draw_canaries", stop_at_draw)
    with pytest.raises(Drawn):
        run_dpsgd_audit(DATA, CONFIG, AuditSettings(**SETTINGS))
    assert calls == [("plan", len(DATA) + 100, len(DATA)), ("draw",)]


def test_cli_refuses_noise_off_without_flag_and_ships_valid_configs(tmp_path):
    from typer.testing import CliRunner

    from dpsynth.cli.audit import AuditJobConfig
    from dpsynth.cli.main import _app
    from dpsynth_core.config import load_config
    configs = Path(__file__).resolve().parent.parent / "configs"
    for name in ("audit_tiny.yaml", "audit_smollm2.yaml"):
        job = load_config(configs / name, AuditJobConfig)
        assert job.train.epsilon == 4.0 and job.audit.noise == "calibrated" and job.audit.canaries >= 1000
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
