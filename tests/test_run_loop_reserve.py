"""The run loop owns budget reservation (issue 36): every stage's planned privacy events are reserved in the
ledger before the first stage runs; a plan over the budget is refused then, before any stage reads data."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsynth_core.errors import BudgetExceededError


def _method(tmp_path: Path, sigma: float, seen: list):
    """Two stages on no data, each one Gaussian count of noise ``sigma`` that it plans and records; each stage
    notes the reservations it finds when it starts."""
    from dpsynth_core.privacy import GaussianEvent, PrivacyLedger
    from dpsynth_core.run_loop.reserve import adopt_reservations
    from dpsynth_core.runs.contract import Stage

    event = GaussianEvent(noise_multiplier=sigma)

    def count(name: str):
        def run(cfg, root: str) -> dict:
            ledger = PrivacyLedger.open(root)
            seen.append((name, sorted(r.stage for r in ledger.reservations())))
            adopt_reservations(ledger, root, name)
            ledger.record(name, event)  # converts the loop's reservation
            return {}
        return run

    stages = [Stage(n, count(n), records=("gaussian",), reads_private=True, plan=lambda cfg, ledger, n=n: [(n, event)])
              for n in ("first", "second")]
    return _toy_method(tmp_path, stages, {"sigma": sigma})


def _toy_method(tmp_path: Path, stages: list, identity: dict):
    """A method of the given stages on no data, its run in ``tmp_path/run``, a budget of ε = 1 at m = 100."""
    from dpsynth_core.runs.contract import Method, PrivacyPlan

    class Toy(Method):
        kind = "toy"

        def stages(self):
            return stages

        def run_dir(self):
            return tmp_path / "run"

        def privacy_plan(self):
            return PrivacyPlan("toy", 1.0, None, 100)

        def release_items(self, root):
            return {}

        def identity(self):
            return identity, ()

    return Toy(None)


def test_a_plan_over_the_budget_is_refused_before_any_stage_runs(tmp_path):
    from dpsynth_core.privacy import PrivacyLedger
    from dpsynth_core.run_loop import run_method

    seen: list = []
    # each count alone fits epsilon 1 (0.73 at delta 1e-5), the two compose to 1.06: the old loop ran the first
    with pytest.raises(BudgetExceededError, match="stage 'second'"):
        run_method(_method(tmp_path, 5.0, seen))
    ledger = PrivacyLedger.open(tmp_path / "run")
    assert seen == [] and ledger.entries() == [] and ledger.reservations() == []
    assert not list((tmp_path / "run").glob("stages/*"))  # no marker, no reservation left for a stage


def test_the_whole_plan_is_reserved_first_and_each_stage_records_against_its_reservation(tmp_path):
    from dpsynth_core.run_loop import run_method

    seen: list = []
    ledger = run_method(_method(tmp_path, 8.0, seen)).ledger
    assert seen == [("first", ["first", "second"]), ("second", ["second"])]
    assert [e.stage for e in ledger.entries()] == ["first", "second"] and ledger.reservations() == []
    assert ledger.total_epsilon() <= 1.0
    assert sorted(p.name for p in (tmp_path / "run" / "stages").iterdir()) == ["first.done", "second.done"]


def _spy_on_stages(monkeypatch, declarations: dict, ran: list) -> None:
    """Every stage of a method's declarations replaced by one that notes its name (a stage that runs fails the test
    below; the real ones would read the private file)."""
    for name, (fn, *rest) in list(declarations.items()):
        monkeypatch.setitem(declarations, name, (lambda cfg, root, name=name: ran.append(name) or {}, *rest))


def test_an_over_budget_actg_plan_is_refused_before_any_stage_runs(tmp_path, monkeypatch):
    """ACTG's private stage plans AIM under eps1 and DP-SGD under eps2: with a charge already in the ledger that
    leaves less than eps1 (a features charge whose features.csv a crash lost: the stage would run AIM again), the
    loop refuses the plan before the first stage; the old loop ran schema, reward_model, then read the private file."""
    from dpsynth_core.actg import pipeline
    from dpsynth_core.actg.features import aim_rho
    from dpsynth_core.privacy import ZCdpEvent
    from dpsynth_core.run_loop import run_method
    from tests.tiny_actg_run import tiny_config

    cfg = pipeline.load_actg_config(tiny_config(tmp_path))
    run = cfg.resolved_run_dir()
    ledger = pipeline.open_or_create_ledger(cfg, run)
    ledger.record("features", ZCdpEvent(rho=aim_rho(3.8, ledger.delta)))  # of epsilon 4
    before = ledger.entries()
    ran: list = []
    _spy_on_stages(monkeypatch, pipeline.STAGE_DECLARATIONS, ran)
    with pytest.raises(BudgetExceededError, match="stage 'features'"):
        run_method(pipeline.ActgMethod(cfg))
    assert ran == [] and ledger.entries() == before and ledger.reservations() == []
    assert not list(run.glob("stages/*"))  # no marker, no reservation left for a stage


def test_an_over_budget_pe_plan_is_refused_before_the_private_data_is_read(tmp_path, monkeypatch):
    """WASP's stage plans its votes' Gaussian event (T compositions): with a charge already in the run's ledger that
    leaves less than the votes need, the loop refuses the plan before the stage; the old stage read the private
    records (``split_data``) and started the PLMs first, then its check refused."""
    from dpsynth_core.pe import pipeline, stage
    from dpsynth_core.pe.config import PEConfig
    from dpsynth_core.privacy import GaussianEvent

    def no_private_read(cfg):
        raise AssertionError("the stage read the private records")

    monkeypatch.setattr(stage, "split_data", no_private_read)
    cfg = PEConfig(method="wasp", run_dir=str(tmp_path / "run"), epsilon=1.0, iterations=2,
                   data={"source": "biorxiv", "classes": ["x", "y"], "num_private": 100})
    ledger = pipeline.open_ledger(cfg, tmp_path / "run")
    ledger.record("earlier", GaussianEvent(noise_multiplier=6.0))  # about 0.6 of epsilon 1
    before = ledger.entries()
    with pytest.raises(BudgetExceededError, match="stage 'wasp.topq_vote'"):
        pipeline.run_pe_method(cfg, make_llms=lambda plms: pytest.fail("the stage started its PLMs"))
    assert ledger.entries() == before and ledger.reservations() == []
    assert not list((tmp_path / "run").glob("stages/*"))  # no marker, no reservation left for the stage


def test_while_a_stage_runs_only_the_stage_beats_its_reservation(tmp_path, monkeypatch):
    """One writer per run: while a stage of an object-store run runs (on another node, with its own copy of the
    run, whose driver copy must not change meanwhile) the loop's process leaves the ledger alone, and the stage
    beats the reservation it adopted (another host would otherwise find it stale)."""
    import time

    from dpsynth_core.privacy import GaussianEvent, PrivacyLedger, reservations
    from dpsynth_core.run_loop import loop, run_method
    from dpsynth_core.run_loop.reserve import adopt_reservations
    from dpsynth_core.runs.contract import Stage

    monkeypatch.setattr(reservations, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(loop, "object_store_uri", lambda path: "s3://bucket/run")  # the loop sees an object-store run
    event, seen = GaussianEvent(noise_multiplier=8.0), []

    def run(cfg, root: str) -> dict:
        ledger = PrivacyLedger.open(root)
        beat = lambda: next(r.heartbeat for r in ledger.reservations() if r.stage == "only")  # noqa: E731
        first = beat()
        time.sleep(0.4)  # eight of the loop's beats, were it beating
        paused = beat()
        adopt_reservations(ledger, root, "only")
        time.sleep(0.4)
        seen.append((first, paused, beat()))
        ledger.record("only", event)
        return {}

    only = Stage("only", run, records=("gaussian",), reads_private=True, plan=lambda cfg, ledger: [("only", event)])
    ledger = run_method(_toy_method(tmp_path, [only], {"toy": 1})).ledger
    ((first, paused, adopted),) = seen
    assert paused == first and adopted > paused
    assert [e.stage for e in ledger.entries()] == ["only"] and ledger.reservations() == []


def _tiny_dpfair(tmp_path: Path, **budget):
    """configs/dpfair_tiny_test.yaml (no DP domain, no marginals) in ``tmp_path/run``, its budget shares updated."""
    import yaml

    from dpsynth_core.tabular.config import load_dpfair_config

    raw = yaml.safe_load((Path(__file__).resolve().parent.parent / "configs" / "dpfair_tiny_test.yaml").read_text())
    raw["budget"].update(budget)
    path = tmp_path / "dpfair.yaml"
    path.write_text(yaml.safe_dump({**raw, "output_dir": str(tmp_path / "run")}))
    return load_dpfair_config(path)


def test_an_over_budget_dpfairllm_plan_is_refused_before_any_stage_runs(tmp_path, monkeypatch):
    """DPFairLLM's DP measurements plan their Gaussian histograms (DP domain, fairness tables, marginals): with a
    charge already in the run's ledger that leaves less than they need, the loop refuses the plan before the first
    stage; the old loop ran the prepare stage (drawing the working subset from the private file) first."""
    from dpsynth_core.privacy import GaussianEvent
    from dpsynth_core.run_loop import open_run_ledger, run_method
    from dpsynth_core.tabular import pipeline

    ran: list = []
    for name in ("prepare", "fair_stats", "marginals", "model", "evaluate", "reference"):
        monkeypatch.setattr(pipeline, f"stage_{name}", lambda cfg, root, name=name: ran.append(name) or {})
    method = pipeline.DpFairMethod(_tiny_dpfair(tmp_path, fair_stats=0.5))  # epsilon 2 for the fairness tables
    ledger = open_run_ledger(tmp_path / "run", method.privacy_plan(), method.kind)
    ledger.record("earlier", GaussianEvent(noise_multiplier=1.1))  # 3.92 of epsilon 4
    before = ledger.entries()
    with pytest.raises(BudgetExceededError, match="stage 'dp_fair_stats'"):
        run_method(method)
    assert ran == [] and ledger.entries() == before and ledger.reservations() == []
    assert not list((tmp_path / "run").glob("stages/*"))  # no marker, no reservation left for a stage


def test_dpfairllm_reserves_its_dp_sgd_with_its_measurements_before_the_first_stage_runs(tmp_path, monkeypatch):
    """The model stage's fill-budget DP-SGD, planned against what the DP measurements planned before it will
    leave, is reserved with them before the first stage reads the private file; the old model stage reserved it
    just before training, after three stages had read the data."""
    from dpsynth_core.privacy import PrivacyLedger
    from dpsynth_core.run_loop import run_method
    from dpsynth_core.tabular import pipeline

    class Stop(Exception):
        pass

    seen: list = []

    def prepare(cfg, root):
        seen.extend((r.stage, r.kind) for r in PrivacyLedger.open(root).reservations())
        raise Stop

    monkeypatch.setattr(pipeline, "stage_prepare", prepare)
    with pytest.raises(Stop):
        run_method(pipeline.DpFairMethod(_tiny_dpfair(tmp_path)))
    assert seen == [("dp_fair_stats", "gaussian"), ("dpsgd", "dpsgd")]
    ledger = PrivacyLedger.open(tmp_path / "run")
    assert ledger.entries() == [] and ledger.reservations() == []  # given back when the run stopped
