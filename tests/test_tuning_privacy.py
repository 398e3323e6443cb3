"""Privacy of hyperparameter tuning: refusal of unaccounted private sweeps, DP selection cost."""

import numpy as np
import pytest

from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy import DpSgdEvent, ZCdpEvent
from dpsynth_core.tuning import (
    TuningPrivacy,
    check_sweep_allowed,
    repeat_and_select_epsilon,
    sample_num_trials,
    single_trial_epsilon,
)

TRIAL = [ZCdpEvent(rho=0.05), DpSgdEvent(noise_multiplier=1.0, sampling_rate=0.01, steps=500)]


def _dp(mean=4.0, distribution="poisson"):
    return TuningPrivacy(data="private", selection="random_trials", mean_trials=mean,
                         distribution=distribution, epsilon_budget=10.0)


def test_private_sweep_without_dp_selection_is_refused():
    with pytest.raises(ConfigError, match="refusing a hyperparameter sweep on private data"):
        check_sweep_allowed(TuningPrivacy(data="private"), "random", "fifo")


def test_adaptive_search_is_refused_for_dp_selection():
    with pytest.raises(ConfigError, match="independent random trials"):
        check_sweep_allowed(_dp(), "optuna", "fifo")
    with pytest.raises(ConfigError, match="independent random trials"):
        check_sweep_allowed(_dp(), "random", "asha")
    check_sweep_allowed(_dp(), "random", "fifo")
    check_sweep_allowed(TuningPrivacy(data="public"), "optuna", "asha")


def test_dp_sweep_needs_a_budget():
    with pytest.raises(ValueError, match="epsilon_budget"):
        TuningPrivacy(data="private", selection="random_trials")


def test_selection_costs_more_than_one_trial_and_grows_with_mean():
    delta = 1e-5
    single = single_trial_epsilon(TRIAL, delta)
    costs = [repeat_and_select_epsilon([TRIAL], _dp(mean), delta) for mean in (2.0, 4.0, 16.0)]
    assert single < costs[0] < costs[1] < costs[2]
    # ...but far less than running and releasing every trial (4 compositions)
    assert costs[1] < single_trial_epsilon(TRIAL * 4, delta)


def test_mixture_of_candidates_is_bounded_by_the_worst_candidate():
    delta = 1e-5
    light = [DpSgdEvent(noise_multiplier=2.0, sampling_rate=0.01, steps=500)]
    heavy = [DpSgdEvent(noise_multiplier=0.8, sampling_rate=0.01, steps=500)]
    both = repeat_and_select_epsilon([light, heavy], _dp(), delta)
    assert both == pytest.approx(repeat_and_select_epsilon([heavy], _dp(), delta))
    assert both > repeat_and_select_epsilon([light], _dp(), delta)


def test_number_of_trials_is_random_with_the_requested_mean():
    rng = np.random.default_rng(0)
    draws = [sample_num_trials(_dp(5.0), rng) for _ in range(4000)]
    assert abs(np.mean(draws) - 5.0) < 0.2
    assert min(draws) == 0  # Poisson can draw no trial at all
    geo = [sample_num_trials(_dp(3.0, "geometric"), rng) for _ in range(4000)]
    assert min(geo) >= 1 and abs(np.mean(geo) - 3.0) < 0.2


def test_selection_event_round_trips_through_the_ledger(tmp_path):
    from dpsynth_core.errors import BudgetExceededError
    from dpsynth_core.privacy import PrivacyLedger
    from dpsynth_core.tuning import selection_event

    event = selection_event([TRIAL, TRIAL], _dp())
    assert len(event.candidates) == 1  # identical trials collapse to one candidate
    ledger = PrivacyLedger.create(tmp_path, dataset="d", epsilon_budget=10.0, delta=1e-5)
    total = ledger.record("hyperparameter_selection", event)
    assert total == pytest.approx(event.epsilon(1e-5), rel=1e-6)
    reopened = PrivacyLedger.open(tmp_path)
    assert reopened.events()[0] == event
    assert reopened.total_epsilon() == pytest.approx(total)
    tight = PrivacyLedger.create(tmp_path / "tight", dataset="d", epsilon_budget=total * 0.9, delta=1e-5)
    with pytest.raises(BudgetExceededError):
        tight.record("hyperparameter_selection", event)
