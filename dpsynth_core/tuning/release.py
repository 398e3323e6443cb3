"""Releasing the best trial of a DP sweep, and nothing else.

Papernot & Steinke bound the release of *one* output, the best. So after selection:

* every trial must have spent within the whole-space bound the sweep was admitted with (a
  planner that drifted from its pipeline would otherwise under-report): checked on the trials'
  own ledgers, whose events depend on configurations only, never on data, so refusing here
  leaks nothing;
* the other trials' run directories (synthetic data, adapters, checkpoints, ledgers, metrics)
  and trial configs are deleted;
* the best trial's ledger is replaced by the released ledger: the selection event (whose
  candidates include this trial's own events, so they are not counted twice) at the sweep's
  budget, then the trial's zero-cost post-processing stages. Its composed total is the true
  cost of the release;
* the best trial's ``release/`` (which its pipeline wrote with the trial's own, smaller epsilon)
  is rebuilt around the released ledger, without timestamps (a trial's start time hints at how
  many trials ran before it). ``verify_release`` refuses a release whose manifest and
  ``ledger.sqlite`` disagree, so the trial's own release can never be published.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from dpsynth_core.privacy import LEDGER_FILE, PrivacyLedger
from dpsynth_core.runs.release import MANIFEST_FILE, rebuild_release, release_dir
from dpsynth_core.tuning.plan import SweepBound

SELECTION_STAGE = "hyperparameter_selection"


class UncoveredTrialError(RuntimeError):
    """A trial spent more than the bound the sweep was admitted with: nothing is released."""


def remove_trial(run_dir: Path) -> None:
    """Delete one trial's outputs: its run directory and its config next to it."""
    shutil.rmtree(run_dir, ignore_errors=True)
    Path(f"{run_dir}.yaml").unlink(missing_ok=True)


def check_trials_covered(run_dirs: list[Path], bound: SweepBound) -> None:
    for run_dir in run_dirs:
        if not (Path(run_dir) / LEDGER_FILE).is_file():
            continue  # failed before its ledger existed, so before any stage read private data: spent nothing
        ledger = PrivacyLedger.open(run_dir)
        if abs(ledger.delta - bound.delta) > 1e-12 * max(1.0, bound.delta) or not bound.covers(ledger.events()):
            raise UncoveredTrialError(
                "a trial's ledger spends outside the sweep's planned bound (its pipeline and its planner in "
                "dpsynth_core/tuning/plan.py disagree); nothing is released and every trial was deleted"
            )


def write_released_ledger(best_dir: Path, bound: SweepBound, budget: float, details: dict | None = None) -> float:
    """Replace ``best_dir``'s ledger by the released one; returns its composed total."""
    trial = PrivacyLedger.open(best_dir)
    entries = trial.entries()
    covered = [{"stage": e.stage, "kind": e.kind, "params": e.params, "epsilon_alone": e.epsilon}
               for e in entries if e.kind != "post_processing"]
    with tempfile.TemporaryDirectory(dir=best_dir) as scratch:
        released = PrivacyLedger.create(scratch, dataset=bound.dataset, epsilon_budget=budget, delta=bound.delta,
                                          public_size=trial.public_size)
        released.record(SELECTION_STAGE, bound.event, {
            **(details or {}),
            "covers_stages": covered,
            "note": "best of a random number of random trials (Papernot & Steinke 2022); the stages listed are "
                    "inside this event's candidates and are not composed again",
        })
        for e in entries:
            if e.kind == "post_processing":
                released.record(e.stage, e.event(), e.details)
        for mark in trial.not_private_reasons():  # a test-only knob in the trial voids the release too
            released.mark_not_private(mark["stage"], mark["reason"])
        os.replace(Path(scratch) / LEDGER_FILE, best_dir / LEDGER_FILE)
    ledger = PrivacyLedger.open(best_dir)
    _refresh_metrics_ledger(best_dir, ledger)
    return ledger.total_epsilon()


def _refresh_metrics_ledger(run_dir: Path, ledger: PrivacyLedger) -> None:
    """metrics.json embeds the ledger summary (ACTG: ``ledger``, PE: ``privacy``): keep it true."""
    path = run_dir / "metrics.json"
    if not path.is_file():
        return
    metrics = json.loads(path.read_text())
    for key in ("ledger", "privacy"):
        if key in metrics:
            metrics[key] = ledger.to_dict()
    path.write_text(json.dumps(metrics, indent=2, default=str))


def release_best(best_dir: Path, run_dirs: list[Path], bound: SweepBound, budget: float) -> float:
    """Check coverage, delete every trial but the best, write the released ledger and rebuild the
    best trial's release around it; its total. On any failure every trial is deleted: a trial's
    own release states its own epsilon, never the selection's."""
    try:
        check_trials_covered(run_dirs, bound)
        for run_dir in run_dirs:
            if Path(run_dir).resolve() != Path(best_dir).resolve():
                remove_trial(run_dir)
        total = write_released_ledger(Path(best_dir), bound, budget)
        rebuild_release(best_dir, PrivacyLedger.open(best_dir), timestamps=False)
        return total
    except BaseException:
        for run_dir in {*run_dirs, Path(best_dir)}:
            remove_trial(run_dir)
        raise


def has_release(run_dir: str | Path) -> bool:
    """A trial is a candidate for release only if its pipeline wrote ``release/`` (its DP outputs)."""
    return (release_dir(run_dir) / MANIFEST_FILE).is_file()
