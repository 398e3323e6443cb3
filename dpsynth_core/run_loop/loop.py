"""The one loop around every method's stages (``runs.contract``): what a run does besides its stages.

    result = run_method(Aim(cfg))                      # every stage in this process
    result = run_method(Actg(cfg), runner=ray_runner)  # a driver chooses where each stage runs

In order: a run this config left where an older release put it is refused (``run_loop.former``) -> the
method's pre-flight (config and whole private file; nothing written) -> the run's lock
(one process per run) -> the rerun rule (``runs.open_run_dir``: a finished run does nothing, another
config is refused naming the changed keys, ``resume=False`` moves the old run aside) -> the ledger
(``run_loop.ledger``: budget, delta rule, reference runs) -> each stage not yet done, through the
runner, the ledger checked for events the stage did not declare, its marker written with its summary,
seconds and ``ran_on`` -> ``release/`` (before the
first owner-side report stage, else before the last stage's marker: every finished run has its release)
-> the report hooks -> the summary lines.

Budget reservation is the loop's: the events of every stage with a ``plan`` are reserved in the ledger
before the first stage runs, and a plan over the budget is refused then (``run_loop.reserve``); a stage
without one reserves (DP-SGD) or records on its own, and every record checks the budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from dpsynth_core.privacy import PrivacyLedger
from dpsynth_core.run_loop.former import refuse_former_run
from dpsynth_core.run_loop.ledger import open_run_ledger
from dpsynth_core.run_loop.reserve import release_reservations, reserve_planned
from dpsynth_core.run_loop.summary import summary_lines
from dpsynth_core.runs import StageMarkers, announce_finished, open_run_dir, refuse_changed_config
from dpsynth_core.runs.contract import Method, Runner, Stage, StageInterrupted, UndeclaredPrivacyEvent, local_runner
from dpsynth_core.runs.files import atomic_write_text
from dpsynth_core.runs.lock import RunLock
from dpsynth_core.runs.run_dir import MovedKeysRun
from dpsynth_core.runs.release import release_dir, write_release
from dpsynth_core.runs.storage import object_store_uri

# Called with the run directory once its release is written: where a run report is written (`dpsynth report`).
ReportHook = Callable[[Path], None]


@dataclass(frozen=True)
class RunResult:
    """A finished (or already finished) run: where it is, where its ledger is, when this invocation started."""

    run_dir: Path
    ledger_dir: Path
    started: float

    @property
    def ledger(self) -> PrivacyLedger:
        return PrivacyLedger.open(self.ledger_dir)

    @property
    def release_dir(self) -> Path:
        return release_dir(self.ledger_dir)

    def summary_lines(self) -> list[str]:
        return summary_lines(self.run_dir, self.started)


def run_method(method: Method, *, resume: bool = True, runner: Runner = local_runner,
               report_hooks: Sequence[ReportHook] = ()) -> RunResult:
    """Run every stage of ``method`` not yet done; see the module doc."""
    started = time.time()
    root, stages = Path(method.run_dir()), method.stages()
    refuse_former_run(root, method.former_run_dir())  # an older release's run of this config: never spent again
    result = RunResult(root, Path(method.ledger_dir(root)), started)
    snapshot, ignore = method.identity()
    moved = getattr(type(method.config), "moved_keys", {})  # a run from before a key moved is named as such
    try:
        same_run = resume and refuse_changed_config(root, snapshot, ignore, moved)
    except MovedKeysRun:
        if not (resume and _finished(result, stages)):
            raise
        same_run = True  # finished before its keys moved: its outputs stand, nothing to run again
    if same_run and _finished(result, stages):
        announce_finished(root)  # the rerun rule first: a finished run reads no data
        return result
    plan = method.privacy_plan()  # before anything is written: a bad config or file leaves nothing
    with RunLock(root):
        open_run_dir(root, snapshot, resume=resume, ignore=ignore, moved=moved)
        if _finished(result, stages):  # by another process while this one checked its data
            announce_finished(root)
            return result
        ledger = open_run_ledger(result.ledger_dir, plan, method.kind)
        markers = StageMarkers(root)
        to_run = [s for s in stages if not s.done(markers)]
        held = reserve_planned(to_run, method.config, ledger, root)  # the whole plan, before any stage runs
        try:
            _run_stages(method, result, stages, runner, markers, ledger)
        finally:
            release_reservations(ledger, held, root, to_run)
        for hook in report_hooks:  # the run report (`dpsynth report`) is written here
            hook(root)
    return result


def _run_stages(method: Method, result: RunResult, stages: Sequence[Stage], runner: Runner,
                markers: StageMarkers, ledger: PrivacyLedger) -> None:
    """Each stage not yet done, in order. While a stage runs elsewhere on an object-store run, this process
    leaves its copy of the ledger alone (one writer per run: the stage's node writes its own copy, which the
    driver pulls after it): the stage beats what it adopted. A run on a shared file system beats as ever."""
    # release/ is written once the DP outputs are in place: before the first owner-side report stage, else
    # before the last stage's marker, so that a finished run (every marker) always has its release
    last = max(i for i, s in enumerate(stages) if not s.after_release)
    for i, stage in enumerate(stages):
        if stage.done(markers):
            continue
        if stage.after_release and not result.release_dir.is_dir():
            _release(method, result)
        copies = object_store_uri(result.ledger_dir) is not None and not stage.in_driver
        with ledger.heartbeats_paused() if copies else nullcontext():
            _run_stage(stage, method, result, runner, markers, release_first=i == last and i == len(stages) - 1)
        if method.stop_after() == stage.name:
            raise StageInterrupted(f"stopped after stage '{stage.name}' (stop_after_stage)")


def _finished(result: RunResult, stages: Sequence[Stage]) -> bool:
    markers = StageMarkers(result.run_dir)
    return all(s.done(markers) for s in stages)


def _run_stage(stage: Stage, method: Method, result: RunResult, runner: Runner, markers: StageMarkers, *,
               release_first: bool = False) -> None:
    t0 = time.perf_counter()
    recorded = len(result.ledger.entries())
    # only the config and the run directory's path travel to the stage (never a private value)
    run_it = local_runner if stage.in_driver else runner
    summary = run_it(stage.run, method.config, str(result.run_dir), **({"isolated": True} if stage.isolated else {}))
    undeclared = {e.kind for e in result.ledger.entries()[recorded:]} - set(stage.records)
    if undeclared:
        raise UndeclaredPrivacyEvent(f"stage {stage.name} recorded {sorted(undeclared)} events but declares "
                                     f"{list(stage.records) or 'none'} (runs/contract.py)")
    if release_first:
        _release(method, result)
    if not stage.marks:
        markers.mark(stage.name, {"seconds": round(time.perf_counter() - t0, 2), **(summary or {})})


def _release(method: Method, result: RunResult) -> None:
    """``release/`` from the method's DP outputs and the ledger; an owner-side text copy of the ledger beside it."""
    ledger = result.ledger
    write_release(result.ledger_dir, method.release_items(result.run_dir), ledger=ledger, method=method.release_name())
    atomic_write_text(result.ledger_dir / "ledger.txt", ledger.render())
