"""A 2-trial public Tune sweep of ACTG on tiny-llama completes, reports and plots."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from dpsynth_core.config import load_config
from ray_jobs.sweep import SweepConfig, run


def test_two_trial_sweep_on_tiny_llama(ray_session, tmp_path):
    raw = yaml.safe_load(open("configs/sweep_actg_tiny.yaml"))
    raw["output_dir"] = str(tmp_path / "sweep")
    # the ranking metric is IFAcc: the owner-side MAUVE / classifier reports only cost time here, and
    # so do AIM's 2-way marginals (a 1-way workload is still AIM under the trial's eps1; the full
    # pipeline is tested in test_actg_pipeline.py)
    raw["overrides"] = {"evaluation.mauve": False, "evaluation.classifier": False, "features.options.degree": 1}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    summary = run(load_config(path, SweepConfig))

    assert summary["num_trials"] == 2 and summary["failed_trials"] == 0
    assert set(summary["best_config"]) == {"privacy.features_share", "rl.gamma0"}
    results = pd.read_csv(tmp_path / "sweep" / "results.csv")
    assert len(results) == 2 and results["ifacc.after_rl"].between(0, 1).all()
    # (CSV round trip: compare to the float tolerance)
    assert summary["best_metric"]["ifacc.after_rl"] == pytest.approx(results["ifacc.after_rl"].max())
    # each trial is a full pipeline run with its own ledger and metrics, at its own eps split
    shares = set()
    for run_dir in results["run_dir"]:
        metrics = json.loads(open(f"{run_dir}/metrics.json").read())
        assert "ifacc" in json.dumps(metrics)
        trial_cfg = yaml.safe_load(open(f"{run_dir}.yaml"))
        shares.add(trial_cfg["privacy"]["features_share"])
    assert len(shares) == 2
    assert (tmp_path / "sweep" / "sweep.json").is_file() and (tmp_path / "sweep" / "sweep.png").is_file()


# --------------------------------------------------------------------------------------------
# DP sweeps on private data. The planner and the trials are analytic stand-ins (the real Tune
# path is exercised above); everything from the refusals to the released ledger is real.
# --------------------------------------------------------------------------------------------
import secrets  # noqa: E402
from pathlib import Path  # noqa: E402

from dpsynth_core.errors import BudgetExceededError, ConfigError  # noqa: E402
from dpsynth_core.privacy import GaussianEvent, PostProcessingEvent, PrivacyLedger, ZCdpEvent  # noqa: E402
from dpsynth_core.tuning_plan import TrialPlan  # noqa: E402


class SplitPlanner:
    """zCDP on ``features_share`` of epsilon, then a Gaussian stage on the rest (monotone in the share)."""

    privacy_free = ("rl.*",)
    monotone = ("privacy.features_share",)

    def plan(self, config: dict) -> TrialPlan:
        eps, share = config["privacy"]["epsilon"], config["privacy"]["features_share"]
        return TrialPlan(events=(ZCdpEvent(rho=0.02 * share * eps),
                                 GaussianEvent(noise_multiplier=1.5 / ((1 - share) * eps))),
                         delta=1e-5, dataset="actg_tiny")


def _private_config(tmp_path, metric="ifacc.after_rl", budget=30.0, mean=3.0):
    raw = yaml.safe_load(open("configs/sweep_actg_tiny.yaml"))
    raw.update(output_dir=str(tmp_path / "sweep"), metric=metric,
               privacy={"data": "private", "selection": "random_trials", "mean_trials": mean,
                        "epsilon_budget": budget})
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path, SweepConfig)


@pytest.fixture
def fake_trials(monkeypatch):
    """Fake planner and trials: each launched trial gets a run dir with its planned ledger, a
    synthetic file and metrics; its score is its features_share. Records every launch's K."""
    from ray import tune

    import ray_jobs.sweep_private as sp

    planner = SplitPlanner()
    launches: list[list[dict]] = []
    monkeypatch.setattr(sp, "planner_for", lambda pipeline: planner)
    monkeypatch.setattr(tune, "Tuner", lambda *a, **k: pytest.fail("a real Tune run was started"))

    def launch(config, base, drawn, extra_event=None, ledgers=True, not_private=False):
        launches.append(drawn)
        outcomes = []
        for params in drawn:
            run_dir = config.output_dir / "trials" / secrets.token_hex(6)
            outcomes.append(sp.TrialOutcome(params=params, run_dir=str(run_dir),
                                            score=params["privacy.features_share"]))
            if not ledgers:  # (each ledger record composes its events: seconds per trial)
                continue
            plan = planner.plan(sp.trial_config(base, config.overrides, params, run_dir))
            ledger = PrivacyLedger.create(run_dir, dataset=plan.dataset, epsilon_budget=100.0, delta=plan.delta)
            for i, event in enumerate(plan.events + ((extra_event,) if extra_event else ())):
                ledger.record(f"stage{i}", event)
            ledger.record("synthesize", PostProcessingEvent(), {"texts": 2})
            if not_private:
                ledger.mark_not_private("dp_generator", "stop_after_steps (test-only knob)")
            (run_dir / "synthetic.jsonl").write_text('{"text": "t"}\n')
            (run_dir / "metrics.json").write_text(json.dumps({"ledger": ledger.to_dict()}))
            Path(f"{run_dir}.yaml").write_text("trial: config\n")
        return outcomes

    monkeypatch.setattr(sp, "launch_trials", launch)
    return launches


def test_dp_sweep_ranked_by_a_private_metric_is_refused_before_any_trial(tmp_path, fake_trials):
    with pytest.raises(ConfigError, match="ranked by 'mauve.mauve': it reads private data.*ifacc.after_rl"):
        run(_private_config(tmp_path, metric="mauve.mauve"))
    assert fake_trials == [] and not (tmp_path / "sweep").exists()


def test_dp_sweep_is_refused_before_launch_when_the_whole_space_exceeds_the_budget(tmp_path, fake_trials):
    from ray_jobs.sweep_private import plan_private
    from tune_spaces.actg import tiny

    config = _private_config(tmp_path)
    base = yaml.safe_load(open(config.base_config))
    _, bound = plan_private(config, base, tiny())
    # a budget the drawn middle of the space would fit, but not its ends
    middle = SplitPlanner().plan({"privacy": {"epsilon": 4.0, "features_share": 0.5}}).events
    from dpsynth_core.tuning import repeat_and_select_epsilon

    cheap = repeat_and_select_epsilon([middle], config.privacy, bound.delta)
    assert cheap < bound.epsilon
    with pytest.raises(BudgetExceededError, match="before any trial.*whole search space"):
        run(_private_config(tmp_path, budget=(cheap + bound.epsilon) / 2))
    assert fake_trials == [] and not (tmp_path / "sweep" / "trials").exists()


def test_dp_sweep_draws_k_from_os_entropy_and_never_writes_it(tmp_path, fake_trials, monkeypatch):
    import ray_jobs.sweep_private as sp
    from tune_spaces.actg import tiny

    config = _private_config(tmp_path, mean=6.0)
    planned = sp.plan_private(config, yaml.safe_load(open(config.base_config)), tiny())
    monkeypatch.setattr(sp, "plan_private", lambda *args: planned)  # the bound once; K is drawn per run
    monkeypatch.setattr(sp, "release_best", lambda *args: 0.0)  # the release has its own test below
    launch = sp.launch_trials
    monkeypatch.setattr(sp, "launch_trials", lambda c, b, d: launch(c, b, d, ledgers=False))
    for i in range(10):  # one config, one seed: K must still vary (Poisson(6): 10 equal draws < 1e-7)
        out = tmp_path / f"sweep{i}"
        summary = run(config.model_copy(update={"output_dir": out}))
        text = (out / "sweep.json").read_text()
        assert json.loads(text) == json.loads(json.dumps(summary, default=str))
        assert "num_trials" not in text and "failed_trials" not in text
        assert not (out / "results.csv").exists() and not (out / "sweep.png").exists()
        assert not (out / "tune").exists()  # Tune's experiment state lists every trial
    ks = [len(d) for d in fake_trials]
    assert len(set(ks)) >= 2
    # the drawn hyperparameters are OS-entropy draws too: no two launches repeat a configuration
    shares = [p["privacy.features_share"] for d in fake_trials for p in d]
    assert len(set(shares)) == len(shares)


def test_dp_sweep_releases_only_the_best_trial_with_the_selection_in_its_ledger(tmp_path, fake_trials, monkeypatch):
    import ray_jobs.sweep_private as sp

    config = _private_config(tmp_path, mean=6.0)
    monkeypatch.setattr(sp, "draw_num_trials", lambda privacy: 4)  # K fixed (a test needs >= 2 trials)
    summary = run(config)
    drawn = fake_trials[-1]
    best = max(drawn, key=lambda p: p["privacy.features_share"])
    assert summary["best_config"] == best
    released = Path(summary["released"])
    trials = tmp_path / "sweep" / "trials"
    # the other trials and their configs are deleted; the released trial keeps its config
    assert sorted(p.name for p in trials.iterdir()) == [released.name, f"{released.name}.yaml"]
    assert (released / "synthetic.jsonl").is_file() and not (tmp_path / "sweep" / "tune").exists()

    ledger = PrivacyLedger.open(released)
    kinds = [e.kind for e in ledger.entries()]
    assert kinds == ["dp_selection", "post_processing"]  # the trial's own events sit inside the selection
    selection = summary["privacy"]["selection_epsilon"]
    from dpsynth_core.tuning import single_trial_epsilon  # what the trial's own ledger said

    alone = single_trial_epsilon(SplitPlanner().plan({"privacy": {"epsilon": 4.0, "features_share": best[
        "privacy.features_share"]}}).events, ledger.delta)
    assert ledger.total_epsilon() >= selection * (1 - 1e-9) > alone
    assert ledger.epsilon_budget == config.privacy.epsilon_budget
    assert summary["released_ledger_epsilon"] == pytest.approx(ledger.total_epsilon())
    metrics = json.loads((released / "metrics.json").read_text())
    assert metrics["ledger"]["total_epsilon"] == pytest.approx(ledger.total_epsilon())
    with pytest.raises(ConfigError, match="already holds a sweep"):  # one release per directory
        run(config)


def test_dp_sweep_releases_nothing_when_a_trial_spent_outside_the_plan(tmp_path, fake_trials, monkeypatch):
    import ray_jobs.sweep_private as sp
    from dpsynth_core.tuning_release import UncoveredTrialError

    launch = sp.launch_trials
    # far above any point of the space (rho = 1 was covered by the worst cell for some draws: a flaky test)
    monkeypatch.setattr(sp, "launch_trials", lambda c, b, d: launch(c, b, d, extra_event=ZCdpEvent(rho=50.0)))
    monkeypatch.setattr(sp, "draw_num_trials", lambda privacy: 2)  # K fixed only to reach the check
    with pytest.raises(UncoveredTrialError, match="nothing is released"):
        run(_private_config(tmp_path))
    assert list((tmp_path / "sweep" / "trials").iterdir()) == []


def test_released_ledger_keeps_a_trial_s_not_private_mark(tmp_path, fake_trials, monkeypatch):
    import ray_jobs.sweep_private as sp

    launch = sp.launch_trials
    monkeypatch.setattr(sp, "launch_trials", lambda c, b, d: launch(c, b, d, not_private=True))
    monkeypatch.setattr(sp, "draw_num_trials", lambda privacy: 1)
    summary = run(_private_config(tmp_path))
    reasons = PrivacyLedger.open(summary["released"]).not_private_reasons()
    assert [r["reason"] for r in reasons] == ["stop_after_steps (test-only knob)"]


def test_search_domains_that_cannot_be_bounded_are_refused():
    from ray import tune

    from ray_jobs.sweep import library_space

    space = library_space({"a": tune.uniform(0.1, 0.9), "b": tune.choice([1, 2]), "c": tune.randint(1, 4), "d": 3})
    assert space["a"].low == 0.1 and space["b"].values == (1, 2) and space["c"].values == (1, 2, 3)
    with pytest.raises(ConfigError, match="'e'.*cannot be drawn"):
        library_space({"e": tune.sample_from(lambda _: 1.0)})


def test_shipped_private_sweep_config_passes_the_pre_launch_checks_that_need_no_planning():
    from dpsynth_core.tuning import check_sweep_allowed

    config = load_config("configs/sweep_actg_private_tiny.yaml", SweepConfig)
    check_sweep_allowed(config.privacy, config.search, config.scheduler, config.pipeline, config.metric)
    assert config.privacy.data == "private" and config.bound_cells >= 1
