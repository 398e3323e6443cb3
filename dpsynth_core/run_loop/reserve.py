"""Budget reservation, owned by the run loop: every stage's planned privacy events reserved before the first runs.

A stage that can name its events before it runs (``Stage.plan``: from the config, public sizes and the ledger)
has them reserved in the run's ledger by the loop, one ``ledger.hold`` each, before any stage runs: a plan
over the budget (with what is recorded and what other runs hold) is refused then (BudgetExceededError, exit
2), and of two runs racing for one budget the loser is refused before it reads private data. The stage,
wherever it runs, takes the reservation over (``adopt_reservations``: its id is in ``stages/NAME.reserved``)
and records against it; a DP-SGD stage trains with the reserved event's noise (``dpsgd.trainer.prepare_stage``).
Whatever the stages did not record is given back when the loop ends (``release_reservations``).
The loop's process beats its reservations (``reservations.Heartbeat``), and the stage what it adopted; on an
object-store run the loop pauses its beats while a stage runs on its own copy (``PrivacyLedger.heartbeats_paused``).
A plan may be a generator: each event is held (and joins the ``PlanningView``) before the next is planned, so a
stage's later event plans against its earlier ones (ACTG: the generator's DP-SGD fits what the features leave).

A stage without a plan records as before: DP-SGD reserves its own event just before it trains, every other
mechanism's record checks the budget.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from dpsynth_core.privacy.composition import compose_epsilon, compose_upper_bound, compose_with_details
from dpsynth_core.runs.contract import Stage
from dpsynth_core.runs.files import atomic_write_text


def _handover(run_dir: Path, stage: str) -> Path:
    return Path(run_dir) / "stages" / f"{stage}.reserved"


class PlanningView:
    """The ledger as a later stage will find it, for its plan: what is recorded plus what the loop reserved so far
    (a stage that spends "what the ledger leaves", AIM, or fills the budget, DP-SGD, plans against this)."""

    def __init__(self, ledger) -> None:
        self.ledger, self.planned = ledger, []

    def __getattr__(self, name):  # delta, epsilon_budget, check (which counts the loop's reservations) ...
        return getattr(self.ledger, name)

    def projected_epsilon(self, event, upper_bound: bool = False) -> float:
        compose = compose_upper_bound if upper_bound else compose_epsilon
        return compose([*self.ledger.events(), *self.planned, event], self.ledger.delta)

    def total_epsilon(self) -> float:
        events = [*self.ledger.events(), *self.planned]
        return compose_with_details(events, self.ledger.delta)[0] if events else 0.0

    def remaining_epsilon(self) -> float:
        return max(0.0, self.ledger.epsilon_budget - self.total_epsilon())


def reserve_planned(stages: Sequence[Stage], config, ledger, run_dir: Path) -> list[str]:
    """Hold every planned event of ``stages`` (those still to run); on a refusal give back what was held."""
    held: list[str] = []
    view = PlanningView(ledger)
    try:
        for stage in stages:
            if stage.plan is None:
                continue
            ids = {}
            for ledger_stage, event in stage.plan(config, view):
                ids[ledger_stage] = ledger.hold(ledger_stage, event).id
                held.append(ledger_stage)
                view.planned.append(event)
            atomic_write_text(_handover(run_dir, stage.name), json.dumps(ids))
    except BaseException:
        release_reservations(ledger, held, run_dir, stages)
        raise
    return held


def release_reservations(ledger, held: Sequence[str], run_dir: Path, stages: Sequence[Stage]) -> None:
    """Give back what the stages did not record (a no-op for a reservation a stage converted)."""
    for ledger_stage in held:
        ledger.release(ledger_stage)
    for stage in stages:
        _handover(run_dir, stage.name).unlink(missing_ok=True)


def adopt_reservations(ledger, run_dir: str | Path, stage: str) -> None:
    """In the stage: take over the reservations the loop made for it (none: the stage reserves as before)."""
    path = _handover(Path(run_dir), stage)
    if path.is_file():
        for ledger_stage, reservation_id in json.loads(path.read_text()).items():
            ledger.adopt(ledger_stage, int(reservation_id))
