"""DP sweeps on private data (Papernot & Steinke 2022). The planner and the trials are analytic
stand-ins that end like real ones (a ledger, ``release/``, ``metrics.json``); everything from the
refusals to the released ledger and the rebuilt release is real, and one test runs them through a
real Ray Tune (the public 2-trial ACTG sweep is in tests/test_sweep.py)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
import yaml

from dpsynth_core.config import load_config
from dpsynth_core.errors import BudgetExceededError, ConfigError
from dpsynth_core.privacy import GaussianEvent, PostProcessingEvent, PrivacyLedger, ZCdpEvent
from dpsynth_core.tuning.plan import TrialPlan
from ray_jobs.sweep import SweepConfig, run


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


def end_like_a_real_trial(run_dir: Path, ledger) -> None:
    """What a pipeline leaves: its DP output, ``release/`` stating the trial's own ledger, metrics."""
    from dpsynth_core.runs.release import write_release

    (run_dir / "synthetic.jsonl").write_text('{"text": "t"}\n')
    write_release(run_dir, {"synthetic.jsonl": run_dir / "synthetic.jsonl"}, ledger=ledger, method="fake trial")
    (run_dir / "metrics.json").write_text(json.dumps({"ledger": ledger.to_dict()}))


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
            end_like_a_real_trial(run_dir, ledger)
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
    from dpsynth_core.tuning.release import UncoveredTrialError

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

    from ray_jobs.sweep_trials import library_space

    space = library_space({"a": tune.uniform(0.1, 0.9), "b": tune.choice([1, 2]), "c": tune.randint(1, 4), "d": 3})
    assert space["a"].low == 0.1 and space["b"].values == (1, 2) and space["c"].values == (1, 2, 3)
    with pytest.raises(ConfigError, match="'e'.*cannot be drawn"):
        library_space({"e": tune.sample_from(lambda _: 1.0)})


def test_shipped_private_sweep_config_passes_the_pre_launch_checks_that_need_no_planning():
    from dpsynth_core.tuning import check_sweep_allowed

    config = load_config("configs/sweep_actg_private_tiny.yaml", SweepConfig)
    check_sweep_allowed(config.privacy, config.search, config.scheduler, config.pipeline, config.metric)
    assert config.privacy.data == "private" and config.bound_cells >= 1


# --------------------------------------------------------------------------------------------
# What a DP sweep publishes (issue 35): the selection's epsilon, never the trial's.
# --------------------------------------------------------------------------------------------
def test_dp_sweep_publishes_the_selection_epsilon_in_the_rebuilt_release(tmp_path, fake_trials, monkeypatch):
    import ray_jobs.sweep_private as sp
    from dpsynth_core.privacy.release_check import copy_release, verify_release
    from dpsynth_core.tuning import single_trial_epsilon

    monkeypatch.setattr(sp, "draw_num_trials", lambda privacy: 3)
    summary = run(_private_config(tmp_path, budget=15.0))
    released = Path(summary["released"])
    ledger = PrivacyLedger.open(released)
    manifest = verify_release(released)
    best = summary["best_config"]["privacy.features_share"]
    trial_alone = single_trial_epsilon(SplitPlanner().plan({"privacy": {"epsilon": 4.0, "features_share": best}}).events,
                                       ledger.delta)
    assert manifest["epsilon"] == pytest.approx(ledger.total_epsilon()) == pytest.approx(summary["released_ledger_epsilon"])
    assert manifest["epsilon"] >= summary["privacy"]["selection_epsilon"] * (1 - 1e-9) > trial_alone
    assert manifest["epsilon_budget"] == 15.0  # the sweep's budget, not the trial's 100
    published = json.loads((released / "release" / "ledger.json").read_text())
    assert [e["stage"] for e in published["entries"]][0] == "hyperparameter_selection"
    assert published["total_epsilon"] == pytest.approx(manifest["epsilon"])
    # no trial's time: when it ran would hint at how many ran before it
    assert published["created"] is None and all(e["timestamp"] is None for e in published["entries"])
    assert "time (UTC)" not in (released / "release" / "ledger.txt").read_text()
    assert "synthetic.jsonl" in manifest["files"]  # the trial's outputs are kept, re-hashed
    assert copy_release(released, tmp_path / "out")["epsilon"] == manifest["epsilon"]


def test_release_is_refused_when_its_manifest_and_the_run_ledger_disagree(tmp_path):
    """A release written before the run's ledger changed (a sweep trial's own release, or a ledger
    replaced by hand) states an epsilon the run does not have: `dpsynth release` refuses it, exit 2."""
    from typer.testing import CliRunner

    from dpsynth.cli.main import _app
    from dpsynth_core.privacy.release_check import verify_release

    run_dir = tmp_path / "run"
    ledger = PrivacyLedger.create(run_dir, dataset="d", epsilon_budget=10.0, delta=1e-5)
    ledger.record("votes", GaussianEvent(noise_multiplier=2.0))
    end_like_a_real_trial(run_dir, ledger)
    verify_release(run_dir)
    ledger.record("more_votes", GaussianEvent(noise_multiplier=2.0))  # spent after the release was written
    with pytest.raises(ConfigError, match=r"disagrees with .*ledger.sqlite on epsilon.*list of ledger entries"):
        verify_release(run_dir)
    result = CliRunner().invoke(_app, ["release", str(run_dir), str(tmp_path / "dest")])
    assert isinstance(result.exception, ConfigError) and not (tmp_path / "dest").exists()


def test_nothing_released_is_said_in_words(tmp_path, fake_trials, monkeypatch, capsys):
    import ray_jobs.sweep_private as sp
    from ray_jobs.sweep import main

    monkeypatch.setattr(sp, "draw_num_trials", lambda privacy: 0)
    config = _private_config(tmp_path, mean=2.0)
    monkeypatch.setattr("ray_jobs.sweep.load_config", lambda path, cls: config)
    summary = main(Path("unused.yaml"))
    assert summary["released"] is None and fake_trials == []
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("nothing was released") and "e^(-mu) = 0.135" in line
    assert "covered by its guarantee" in line


def test_a_trial_that_failed_before_its_ledger_leaves_no_other_trial_on_disk(tmp_path, fake_trials, monkeypatch):
    import ray_jobs.sweep_private as sp

    launch = sp.launch_trials

    def with_an_early_failure(config, base, drawn):
        outcomes = launch(config, base, drawn)
        failed = config.output_dir / "trials" / secrets.token_hex(6)
        failed.mkdir()  # the trial's folder, then a crash before its pipeline created the ledger
        return outcomes + [sp.TrialOutcome(params=drawn[0], run_dir=None, score=None)]

    monkeypatch.setattr(sp, "launch_trials", with_an_early_failure)
    monkeypatch.setattr(sp, "draw_num_trials", lambda privacy: 2)
    summary = run(_private_config(tmp_path))
    released = Path(summary["released"])
    assert sorted(p.name for p in (tmp_path / "sweep" / "trials").iterdir()) == [released.name, f"{released.name}.yaml"]
    # and if the release itself fails, no trial's own release is left to publish
    monkeypatch.setattr("dpsynth_core.tuning.release.rebuild_release",
                        lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    (tmp_path / "again").mkdir()
    with pytest.raises(OSError, match="disk full"):
        run(_private_config(tmp_path / "again"))
    assert list((tmp_path / "again" / "sweep" / "trials").iterdir()) == []


def test_dp_sweep_on_real_tune_is_silent_leaves_no_staging_and_keeps_a_trial_whose_evaluation_failed(
        ray_session, tmp_path, monkeypatch, capfd):
    """Through a real Ray Tune, in verbose mode: nothing printed tells K; no result.json,
    progress.csv or experiment state is left under Ray's session directory or output_dir; each
    trial is handed its own configuration only; a trial whose owner-side evaluation crashed after
    its release and private-free metric were written still competes (here it is the best)."""
    import sys

    import ray_jobs.sweep_private as sp
    from dpsynth_core.privacy.release_check import verify_release
    from ray import cloudpickle, tune
    from ray_jobs.sweep_trials import run_trial

    session = Path(ray_session._private.worker._global_node.get_session_dir_path())
    planner = SplitPlanner()
    monkeypatch.setattr(sp, "planner_for", lambda pipeline: planner)
    monkeypatch.setattr(sp, "draw_num_trials", lambda privacy: 3)
    monkeypatch.setenv("DPSYNTH_VERBOSE", "1")
    seen = tmp_path / "seen"
    seen.mkdir()

    def fake_pipeline_main(config_path, resume=True):
        """A pipeline run: ledger, release/, metrics.json (private-free part), then evaluation."""
        config = yaml.safe_load(Path(config_path).read_text())
        run_dir, share = Path(config["output_dir"]), config["privacy"]["features_share"]
        ledger = PrivacyLedger.create(run_dir, dataset="actg_tiny", epsilon_budget=100.0, delta=1e-5)
        for i, event in enumerate(planner.plan(config).events):
            ledger.record(f"stage{i}", event)
        end_like_a_real_trial(run_dir, ledger)
        (run_dir / "metrics.json").write_text(json.dumps({"ifacc": {"after_rl": share}}))
        if share > 0.5:
            raise RuntimeError("held-out evaluation failed")  # after the ranking metric was written
        return run_dir

    def trainable(params):
        import sys
        import types

        (seen / secrets.token_hex(4)).write_text(json.dumps(params))
        sys.modules["ray_jobs.fake_pipeline"] = types.SimpleNamespace(main=fake_pipeline_main)
        run_trial(params, pipeline="fake_pipeline", base=base, overrides={}, trials_dir=str(tmp_path / "sweep" / "trials"),
                  metric="ifacc.after_rl", private=True)

    config = _private_config(tmp_path)
    base = yaml.safe_load(open(config.base_config))
    monkeypatch.setattr(sp, "make_trainable", lambda *a, **k: tune.with_resources(trainable, {"cpu": 1}))
    drawn_shares = []
    draw = sp.draw_configurations

    def draw_with_one_above_half(space, k):
        drawn = draw(space, k)
        # the best (above every other draw: the space reaches past 0.69) and > 0.5, so its evaluation crashes
        drawn[0]["privacy.features_share"] = max([0.69] + [d["privacy.features_share"] for d in drawn[1:]]) + 0.01
        drawn_shares.extend(d["privacy.features_share"] for d in drawn)
        return drawn

    monkeypatch.setattr(sp, "draw_configurations", draw_with_one_above_half)
    tune_files = ("result.json", "progress.csv", "experiment_state*.json", "tuner.pkl", "*.tfevents*")
    before = {p for pattern in tune_files for p in session.rglob(pattern)}
    capfd.readouterr()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Tune's workers cannot import this test file
    try:
        summary = run(config)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    out, err = capfd.readouterr()

    assert "trial" not in (out + err).lower(), out + err  # no banner ("Number of trials 3"), no table, no log line
    after = {p for pattern in tune_files for p in session.rglob(pattern)}
    assert after == before and not list((tmp_path / "sweep").rglob("result.json"))
    assert not (tmp_path / "sweep" / "tune").exists()
    handed = [json.loads(p.read_text()) for p in seen.iterdir()]
    assert len(handed) == 3 and all(set(h) == {"trial"} and isinstance(json.loads(h["trial"]), dict) for h in handed)
    assert summary["best_config"]["privacy.features_share"] == drawn_shares[0] == max(drawn_shares)
    assert verify_release(summary["released"])["epsilon"] >= summary["privacy"]["selection_epsilon"] * (1 - 1e-9)
