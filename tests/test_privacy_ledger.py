"""Privacy ledger: composition of mixed events, refusal before any write, persistence and
atomicity across processes."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpsynth_core.errors import BudgetExceededError, ConfigError
from dpsynth_core.privacy import (
    LEDGER_FILE,
    DpSgdEvent,
    GaussianEvent,
    PostProcessingEvent,
    PrivacyLedger,
    ZCdpEvent,
    default_delta,
    epsilon_dpsgd,
    gaussian_epsilon,
    zcdp_to_epsilon,
)

DELTA = 1e-5
REPO = Path(__file__).resolve().parent.parent
DPSGD = DpSgdEvent(noise_multiplier=1.0, sampling_rate=0.01, steps=1000)
AIM = ZCdpEvent(rho=0.05)
HIST = GaussianEvent(noise_multiplier=20.0, compositions=10)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def test_mixed_events_compose_below_sum_and_above_max(tmp_path):
    ledger = PrivacyLedger.create(tmp_path / "run", "biorxiv", epsilon_budget=10.0, delta=DELTA)
    totals = [
        ledger.record("dpsgd", DPSGD, {"model": "tiny-llama"}),
        ledger.record("aim", AIM),
        ledger.record("pe-histograms", HIST),
        ledger.record("generate", PostProcessingEvent()),
    ]
    entries = ledger.entries()
    assert [e.stage for e in entries] == ["dpsgd", "aim", "pe-histograms", "generate"]
    alone = [e.epsilon for e in entries]
    # each event alone, by its own exact / tight accountant
    assert alone[0] == pytest.approx(epsilon_dpsgd(0.01, 1.0, 1000, DELTA))
    assert alone[1] == pytest.approx(zcdp_to_epsilon(0.05, DELTA))
    assert alone[2] == pytest.approx(gaussian_epsilon(20.0, 10, DELTA))
    assert alone[3] == 0.0
    total = ledger.total_epsilon()
    assert total == pytest.approx(totals[-1])
    assert max(alone) <= total < sum(alone), (alone, total)  # composed, not added
    assert totals == sorted(totals) and totals[-1] == totals[-2]  # post-processing is free
    assert [e.total_epsilon_after for e in entries] == pytest.approx(totals)
    assert entries[0].details == {"model": "tiny-llama"}
    assert entries[0].event() == DPSGD
    assert ledger.remaining_epsilon() == pytest.approx(10.0 - total)

    d = ledger.to_dict()
    json.dumps(d)  # JSON-ready
    assert d["total_epsilon"] == pytest.approx(total) and d["delta"] == DELTA
    assert d["composition_candidates"][d["composition_method"]] == pytest.approx(total)
    assert all(v >= total - 1e-12 for v in d["composition_candidates"].values())
    text = ledger.render()
    for needle in ("dpsgd", "aim", "pe-histograms", "post_processing", f"{total:.4f}", "budget 10"):
        assert needle in text


def test_zcdp_and_gaussian_compose_as_zcdp(tmp_path):
    ledger = PrivacyLedger.create(tmp_path, "adult", 5.0, DELTA)
    ledger.record("aim", AIM)
    total = ledger.record("hist", HIST)
    # A Gaussian released T times with multiplier s is exactly T / (2 s^2)-zCDP; rho adds up.
    zcdp_bound = zcdp_to_epsilon(0.05 + 10 / (2 * 20.0**2), DELTA)
    assert total <= zcdp_bound * (1 + 1e-9)
    assert total > zcdp_to_epsilon(0.05, DELTA)


def test_single_event_ledger_matches_accountant(tmp_path):
    ledger = PrivacyLedger.create(tmp_path, "biorxiv", 3.0, DELTA)
    assert ledger.total_epsilon() == 0.0
    assert ledger.check("dpsgd", DPSGD) == pytest.approx(epsilon_dpsgd(0.01, 1.0, 1000, DELTA), rel=1e-6)
    assert ledger.entries() == []  # check writes nothing


def test_refusal_over_budget_leaves_ledger_unchanged(tmp_path):
    run = tmp_path / "run"
    ledger = PrivacyLedger.create(run, "biorxiv", epsilon_budget=1.0, delta=DELTA)
    first = ledger.record("hist", GaussianEvent(noise_multiplier=10.0, compositions=4))
    before = _digest(run / LEDGER_FILE)
    big = GaussianEvent(noise_multiplier=2.0)
    with pytest.raises(BudgetExceededError) as info:
        ledger.check("second-hist", big)
    message = str(info.value)
    assert "second-hist" in message and "budget epsilon=1" in message
    projected = float(message.split("epsilon=")[1].split(" ")[0])
    assert projected > 1.0
    with pytest.raises(BudgetExceededError):
        ledger.record("second-hist", big)
    assert _digest(run / LEDGER_FILE) == before
    assert len(PrivacyLedger.open(run).entries()) == 1
    assert PrivacyLedger.open(run).total_epsilon() == pytest.approx(first)
    # a stage that fits is still accepted after a refusal
    assert ledger.record("small", GaussianEvent(noise_multiplier=50.0)) <= 1.0


def test_persistence_across_processes(tmp_path):
    run = tmp_path / "run"
    proc = _run_python(
        f"""
        from dpsynth_core.privacy import PrivacyLedger, DpSgdEvent, ZCdpEvent
        ledger = PrivacyLedger.create({str(run)!r}, "biorxiv", 8.0, {DELTA!r})
        ledger.record("dpsgd", DpSgdEvent(noise_multiplier=1.0, sampling_rate=0.01, steps=1000))
        print(repr(ledger.record("aim", ZCdpEvent(rho=0.05))))
        """
    )
    assert proc.returncode == 0, proc.stderr
    child_total = float(proc.stdout.strip().splitlines()[-1])
    ledger = PrivacyLedger.open(run)
    assert (ledger.dataset, ledger.epsilon_budget, ledger.delta) == ("biorxiv", 8.0, DELTA)
    assert [e.kind for e in ledger.entries()] == ["dpsgd", "zcdp"]
    assert ledger.total_epsilon() == pytest.approx(child_total, rel=1e-12)
    ledger.record("hist", HIST)
    proc = _run_python(
        f"""
        from dpsynth_core.privacy import PrivacyLedger
        print(repr(PrivacyLedger.open({str(run)!r}).total_epsilon()))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout.strip().splitlines()[-1]) == pytest.approx(ledger.total_epsilon(), rel=1e-12)


def test_concurrent_records_cannot_both_overspend(tmp_path):
    run = tmp_path / "run"
    # each event alone fits in the budget, both together do not
    eps_one = gaussian_epsilon(3.0, 1, DELTA)
    budget = 1.2 * eps_one
    assert gaussian_epsilon(3.0, 2, DELTA) > budget
    PrivacyLedger.create(run, "biorxiv", budget, DELTA)
    code = f"""
        import sys
        from dpsynth_core.errors import BudgetExceededError
        from dpsynth_core.privacy import PrivacyLedger, GaussianEvent
        ledger = PrivacyLedger.open({str(run)!r})
        try:
            ledger.record(sys.argv[1], GaussianEvent(noise_multiplier=3.0))
            print("recorded")
        except BudgetExceededError:
            print("refused")
        """
    procs = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), f"stage{i}"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    assert sorted(o[0].strip() for o in outs) == ["recorded", "refused"]
    ledger = PrivacyLedger.open(run)
    assert len(ledger.entries()) == 1 and ledger.total_epsilon() <= budget


def test_create_open_errors(tmp_path):
    with pytest.raises(ConfigError, match="no privacy ledger"):
        PrivacyLedger.open(tmp_path / "missing")
    PrivacyLedger.create(tmp_path, "biorxiv", 2.0, DELTA)
    again = PrivacyLedger.create(tmp_path, "biorxiv", 2.0, DELTA)  # same parameters: resume
    assert again.epsilon_budget == 2.0
    with pytest.raises(ConfigError, match="already exists"):
        PrivacyLedger.create(tmp_path, "biorxiv", 3.0, DELTA)
    with pytest.raises(ConfigError, match="delta"):
        PrivacyLedger.create(tmp_path / "b", "biorxiv", 2.0, 1.5)
    with pytest.raises(ConfigError, match="epsilon_budget"):
        PrivacyLedger.create(tmp_path / "c", "biorxiv", -1.0, DELTA)
    with pytest.raises(ConfigError, match="unknown privacy event"):
        again.record("x", {"rho": 1.0})
    assert not any(p.name.startswith(".ledger-") for p in tmp_path.iterdir())  # no temp leftovers


def test_post_processing_only_costs_nothing(tmp_path):
    ledger = PrivacyLedger.create(tmp_path, "adult", 1.0, default_delta(30000))
    assert ledger.record("eval", PostProcessingEvent()) == 0.0
    assert ledger.remaining_epsilon() == 1.0
    assert math.isclose(ledger.delta, min(1e-5, 30000 ** -1.1))


def test_mark_not_private_is_permanent_and_shown_with_every_total(tmp_path):
    ledger = PrivacyLedger.create(tmp_path, "toy", 4.0, DELTA)
    assert ledger.is_private and ledger.not_private_reasons() == [] and ledger.to_dict()["private"] is True
    assert "NOT PRIVATE" not in ledger.render()
    ledger.record("dpsgd", DPSGD)
    ledger.mark_not_private("dpsgd", "sampling_seed is fixed")
    ledger.mark_not_private("dpsgd", "sampling_seed is fixed")  # kept once
    reopened = PrivacyLedger.open(tmp_path)  # persisted, seen by another handle
    assert [(m["stage"], m["reason"]) for m in reopened.not_private_reasons()] == [("dpsgd", "sampling_seed is fixed")]
    d = reopened.to_dict()
    assert d["private"] is False and d["not_private"][0]["reason"] == "sampling_seed is fixed"
    assert d["total_epsilon"] == pytest.approx(ledger.total_epsilon())  # the figure stays, flagged
    text = reopened.render()
    assert "NOT PRIVATE (dpsgd): sampling_seed is fixed" in text and "NOT PRIVATE, composed: epsilon=" in text
    with pytest.raises(ConfigError, match="reason"):
        ledger.mark_not_private("dpsgd", " ")


# ------------------------------------------------------------------------------- reservations
HOLDER = """
    import sys
    from dpsynth_core.privacy import PrivacyLedger, GaussianEvent
    ledger = PrivacyLedger.open({run!r})
    with ledger.reserve("first", GaussianEvent(noise_multiplier=3.0)):
        print("held", flush=True)
        if sys.stdin.readline().strip() == "crash":
            import os; os._exit(3)  # killed inside the stage: no cleanup runs
        ledger.record("first", GaussianEvent(noise_multiplier=3.0))
    print("recorded", flush=True)
"""


def _one_fits(run: Path) -> PrivacyLedger:
    """A ledger whose budget holds one GaussianEvent(3.0) but not two."""
    budget = 1.2 * gaussian_epsilon(3.0, 1, DELTA)
    assert gaussian_epsilon(3.0, 2, DELTA) > budget
    return PrivacyLedger.create(run, "biorxiv", budget, DELTA)


def _holder(run: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLDER.format(run=str(run)))], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held", proc.stderr.read()
    return proc


def test_reservation_of_a_running_stage_refuses_another_before_it_starts(tmp_path):
    run = tmp_path / "run"
    ledger = _one_fits(run)
    holder = _holder(run)
    try:
        with pytest.raises(BudgetExceededError, match=rf"reserved by stages still running: 'first' .*pid {holder.pid}"):
            with ledger.reserve("second", GaussianEvent(noise_multiplier=3.0)):
                pytest.fail("the second stage must not start")
        with pytest.raises(BudgetExceededError):  # a plain check counts the reservation too
            ledger.check("second", GaussianEvent(noise_multiplier=3.0))
        assert [r.stage for r in ledger.reservations()] == ["first"]
        assert "budget reserved by a running stage: 'first'" in ledger.render()
        assert ledger.entries() == []  # nothing recorded yet: refused on the reservation alone
    finally:
        out, err = holder.communicate("go\n", timeout=60)
    assert holder.returncode == 0 and out.split() == ["recorded"], err
    # record() turned the reservation into the event, in one transaction
    assert [e.stage for e in ledger.entries()] == ["first"] and ledger.reservations() == []


def test_reservation_is_released_when_the_stage_fails(tmp_path):
    ledger = _one_fits(tmp_path / "run")
    with pytest.raises(RuntimeError, match="stage failed"):
        with ledger.reserve("first", GaussianEvent(noise_multiplier=3.0)):
            raise RuntimeError("stage failed")
    assert ledger.reservations() == [] and ledger.entries() == []
    with ledger.reserve("again", GaussianEvent(noise_multiplier=3.0)):
        ledger.record("again", GaussianEvent(noise_multiplier=3.0))
    assert [e.stage for e in ledger.entries()] == ["again"]


def test_reservation_of_a_dead_process_is_cleared(tmp_path):
    import sqlite3
    import time

    from dpsynth_core.privacy.reservations import STALE_AFTER_S

    run = tmp_path / "run"
    ledger = _one_fits(run)
    holder = _holder(run)
    holder.communicate("crash\n", timeout=60)
    assert holder.returncode == 3
    with sqlite3.connect(run / LEDGER_FILE) as conn:  # the row is still there ...
        assert conn.execute("SELECT pid FROM reservations").fetchall() == [(holder.pid,)]
    assert ledger.reservations() == []  # ... but its process is gone: it does not count
    # another host's row counts while its heartbeat is fresh and is cleared once it is stale
    with sqlite3.connect(run / LEDGER_FILE) as conn:
        conn.execute("INSERT INTO reservations (stage, kind, params, pid, host, process_start, created, heartbeat) "
                     "VALUES ('remote', 'gaussian', ?, 1, 'another-node', '', '', ?)",
                     (json.dumps(GaussianEvent(noise_multiplier=3.0).params()), time.time()))
    with pytest.raises(BudgetExceededError, match="'remote' .*another-node"):
        ledger.check("local", GaussianEvent(noise_multiplier=3.0))
    with sqlite3.connect(run / LEDGER_FILE) as conn:
        conn.execute("UPDATE reservations SET heartbeat = ? WHERE host = 'another-node'", (time.time() - STALE_AFTER_S - 1,))
    with ledger.reserve("local", GaussianEvent(noise_multiplier=3.0)) as held:
        assert [r.id for r in ledger.reservations()] == [held.id]
        ledger.record("local", GaussianEvent(noise_multiplier=3.0))
    with sqlite3.connect(run / LEDGER_FILE) as conn:  # both stale rows were deleted by the reservation
        assert conn.execute("SELECT COUNT(*) FROM reservations").fetchone() == (0,)


def test_ledger_show_and_the_release_state_m_times_delta_with_the_public_size(tmp_path):
    """The public working-set size m (what the config declares, never a drawn or file count) is kept
    with the ledger; `dpsynth ledger show` and the release manifest state m * delta next to delta."""
    from typer.testing import CliRunner

    from dpsynth.cli.main import _app
    from dpsynth_core.runs.release import write_release

    ledger = PrivacyLedger.create(tmp_path, "d", 4.0, default_delta(300), public_size=300)
    ledger.record("votes", GaussianEvent(noise_multiplier=3.0))
    assert ledger.public_size == 300 and ledger.to_dict()["m_times_delta"] == pytest.approx(300 * 1e-5)
    shown = CliRunner().invoke(_app, ["ledger", "show", str(tmp_path)])
    assert shown.exit_code == 0 and "m * delta = 0.003 (m = 300, the public working-set size" in shown.output
    (tmp_path / "out.txt").write_text("x")
    write_release(tmp_path, {"out.txt": tmp_path / "out.txt"}, ledger=ledger, method="test")
    manifest = json.loads((tmp_path / "release" / "MANIFEST.json").read_text())
    assert manifest["public_size"] == 300 and manifest["m_times_delta"] == pytest.approx(0.003)
    assert PrivacyLedger.create(tmp_path / "old", "d", 4.0, 1e-5).public_size is None  # made without one


def test_the_search_bound_is_not_below_the_ledgers_epsilon(tmp_path):
    """compose_upper_bound (fill_budget's search figure) is at least the recorded composition, within 1 %
    of it where PLD is the tightest candidate, and falls back to it for a selection (RDP only)."""
    from dpsynth_core.privacy import SelectionEvent
    from dpsynth_core.privacy.composition import compose_upper_bound, compose_with_details

    small = DpSgdEvent(noise_multiplier=0.9, sampling_rate=0.1, steps=20)
    for events in ([small], [HIST, small], [AIM, small], [AIM, HIST], [HIST, GaussianEvent(noise_multiplier=5.0)]):
        exact, method, _ = compose_with_details(events, DELTA)
        bound = compose_upper_bound([*events, PostProcessingEvent()], DELTA)
        assert bound >= exact, events
        if method == "pld":
            assert bound <= exact * 1.01, events
    selection = [HIST, SelectionEvent(candidates=((small,),), mean_trials=2.0)]
    assert compose_upper_bound(selection, DELTA) == compose_with_details(selection, DELTA)[0]
    assert compose_upper_bound([PostProcessingEvent()], DELTA) == 0.0
