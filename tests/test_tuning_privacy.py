"""Privacy of hyperparameter tuning: refusal of unaccounted private sweeps, DP selection cost,
private-free ranking metrics, secret K, and the cost bounded over the whole search space."""

import numpy as np
import pytest

from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy import DpSgdEvent, GaussianEvent, ZCdpEvent
from dpsynth_core.tuning import (
    TuningPrivacy,
    check_sweep_allowed,
    draw_num_trials,
    repeat_and_select_epsilon,
    single_trial_epsilon,
)
from dpsynth_core.tuning.plan import TrialPlan, bound_sweep
from dpsynth_core.tuning.space import Choice, Interval, draw_configurations

TRIAL = [ZCdpEvent(rho=0.05), DpSgdEvent(noise_multiplier=1.0, sampling_rate=0.01, steps=500)]


def _dp(mean=4.0, distribution="poisson"):
    return TuningPrivacy(data="private", selection="random_trials", mean_trials=mean,
                         distribution=distribution, epsilon_budget=10.0)


def test_private_sweep_without_dp_selection_is_refused():
    with pytest.raises(ConfigError, match="refusing a hyperparameter sweep on private data"):
        check_sweep_allowed(TuningPrivacy(data="private"), "random", "fifo", "actg", "ifacc.after_rl")


def test_adaptive_search_is_refused_for_dp_selection():
    with pytest.raises(ConfigError, match="independent random trials"):
        check_sweep_allowed(_dp(), "optuna", "fifo", "actg", "ifacc.after_rl")
    with pytest.raises(ConfigError, match="independent random trials"):
        check_sweep_allowed(_dp(), "random", "asha", "actg", "ifacc.after_rl")
    check_sweep_allowed(_dp(), "random", "fifo", "actg", "ifacc.after_rl")
    check_sweep_allowed(TuningPrivacy(data="public"), "optuna", "asha", "actg", "mauve.mauve")


@pytest.mark.parametrize("pipeline, metric", [
    ("actg", "mauve.mauve"),                                  # against held-out private texts
    ("actg", "downstream.synthetic_labels_extracted.accuracy"),  # tested on private texts
    ("actg", "features.djs_1way_mean"),                       # against the real attributes
    ("actg", "dp_generator.last_loss"),                       # on private batches
    ("actg", "some_new_metric"),                              # undeclared: reads private data
    ("dpfair", "tstr.accuracy"),                              # trained/tested on the private sample
    ("wasp", "evaluation.accuracy"),
])
def test_private_sweep_ranked_by_a_metric_that_reads_private_data_is_refused(pipeline, metric):
    with pytest.raises(ConfigError, match=f"ranked by '{metric}': it reads private data") as err:
        check_sweep_allowed(_dp(), "random", "fifo", pipeline, metric)
    if pipeline == "actg":
        assert "ifacc.after_rl" in str(err.value)  # the message names what is allowed
    else:
        assert "no metric computed without private data" in str(err.value)


def test_private_free_metrics_are_accepted_and_public_sweeps_rank_by_anything():
    from dpsynth_core.tuning.metrics import metric_privacy

    for metric in ("ifacc.after_rl", "ifacc.best_of_n", "ifacc.after_rl_per_field.topic", "synthetic_stats.distinct_2"):
        assert metric_privacy("actg", metric) == "private-free"
        check_sweep_allowed(_dp(), "random", "fifo", "actg", metric)
    check_sweep_allowed(TuningPrivacy(data="public"), "random", "fifo", "dpfair", "tstr.accuracy")


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
    draws = [draw_num_trials(_dp(5.0)) for _ in range(4000)]  # OS entropy: no generator passed
    assert abs(np.mean(draws) - 5.0) < 0.2  # 5.7 standard errors
    assert min(draws) == 0  # Poisson can draw no trial at all
    geo = [draw_num_trials(_dp(3.0, "geometric")) for _ in range(4000)]
    assert min(geo) >= 1 and abs(np.mean(geo) - 3.0) < 0.2


def test_number_of_trials_does_not_follow_any_seed(monkeypatch):
    """K must not be reproducible from a public seed: even with numpy's global and default_rng
    seeding pinned to one value, repeated draws differ (the old sweep drew K from
    default_rng(config.seed))."""
    pinned = np.random.default_rng
    monkeypatch.setattr(np.random, "default_rng", lambda seed=None: pinned(0 if seed is None else seed))
    np.random.seed(0)
    draws = [draw_num_trials(_dp(4.0)) for _ in range(200)]
    assert len(set(draws)) >= 5  # Poisson(4): 200 equal draws has probability < 1e-100


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


class SplitPlanner:
    """An analytic stand-in for a pipeline planner: a zCDP stage on ``share`` of epsilon, then a
    Gaussian stage on the rest (each stage's cost monotone in the share, like ACTG's AIM / DP-SGD)."""

    privacy_free = ("rl.*",)
    monotone = ("privacy.features_share",)

    def plan(self, config: dict) -> TrialPlan:
        eps, share = config["privacy"]["epsilon"], config["privacy"]["features_share"]
        return TrialPlan(events=(ZCdpEvent(rho=0.02 * share * eps), GaussianEvent(noise_multiplier=1.5 / ((1 - share) * eps))),
                         delta=1e-5, dataset="d")


def _config_for(params: dict) -> dict:
    config = {"privacy": {"epsilon": 4.0, "features_share": 0.5}}
    for key, value in params.items():
        section, name = key.split(".")
        config.setdefault(section, {})[name] = value
    return config


SPACE = {"privacy.features_share": Interval(0.1, 0.9), "rl.gamma0": Choice((1.0, 2.0))}


def test_bound_over_the_whole_space_covers_every_drawn_subset():
    planner, privacy = SplitPlanner(), _dp(4.0)
    bound = bound_sweep(planner, SPACE, _config_for, privacy, cells_per_interval=4)
    for _ in range(5):
        drawn = draw_configurations(SPACE, 6)
        events = [planner.plan(_config_for(p)).events for p in drawn]
        assert all(bound.covers(e) for e in events)  # every drawn trial is inside the per-trial curve
        assert repeat_and_select_epsilon(events, privacy, 1e-5) <= bound.epsilon * (1 + 1e-9)
    # ...including points between grid nodes, and both ends of the range
    for share in np.linspace(0.1, 0.9, 33):
        assert bound.covers(planner.plan(_config_for({"privacy.features_share": share})).events)
    # the old bound (over the configurations drawn) under-reports when the draws miss the ends
    middle = [planner.plan(_config_for({"privacy.features_share": s})).events for s in (0.45, 0.5, 0.55)]
    assert repeat_and_select_epsilon(middle, privacy, 1e-5) < bound.epsilon * 0.99


def test_unboundable_spaces_are_refused():
    planner, privacy = SplitPlanner(), _dp(4.0)
    with pytest.raises(ConfigError, match="'privacy.epsilon' is a continuous range"):
        bound_sweep(planner, {"privacy.epsilon": Interval(1.0, 8.0)}, _config_for, privacy)
    # a privacy-free continuous key needs no monotonicity: it is fixed for planning
    bound_sweep(planner, {"rl.gamma0": Interval(0.0, 4.0)}, _config_for, privacy)
