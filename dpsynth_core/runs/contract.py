"""The run contract: a method is a typed config plus an ordered list of stages (Ray-free, ledger-free).

    class Aim(Method):
        kind = "aim"
        def stages(self): return [Stage("prepare", stage_prepare, records=("gaussian",), reads_private=True), ...]
        def privacy_plan(self): ...        # pre-flight: config and whole file checked, nothing written
        def release_items(self, root): ... # the DP outputs to publish

    run_dir = run_method(Aim(cfg))         # dpsynth_core.run_loop: the one loop around the stages

A stage is ``(config, run_dir: str) -> summary`` (a small JSON dict, never a private value). It
declares the privacy events it records in the run's ledger, whether it reads private data, and
whether it must run isolated from the private data directory (ACTG's RL stage). Everything around
the stages -- pre-flight, lock, rerun rule, resume, markers, ledger, release, summary, reference
runs -- is the loop's (``dpsynth_core.run_loop``), not the method's.

This module sits at the bottom beside the run directory: it names what a method declares and
imports neither the ledger nor any method.
"""

from __future__ import annotations

import math
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from dpsynth_core.runs.run_dir import StageMarkers

# The kinds of privacy event a stage may record (the ledger's event kinds, by name); the run loop
# checks after each stage that the ledger holds no event of a kind the stage did not declare.
EVENT_KINDS = ("gaussian", "zcdp", "dpsgd", "post_processing")

StageFn = Callable[[Any, str], "dict | None"]
# (config, ledger) -> [(ledger stage, event)]: the privacy events a stage will record, known before it runs
# (a list, or a generator: each event is reserved before the next is planned, see run_loop.reserve)
PlanFn = Callable[[Any, Any], Iterable[tuple[str, Any]]]


@dataclass(frozen=True)
class Stage:
    """One step of a method: ``run(config, run_dir)`` returns its summary (the marker's content).

    ``marks``: the markers the stage writes itself (a stage that runs several steps in one process,
    e.g. DPFairLLM's train + generate); empty: the loop writes ``stages/<name>.done``.
    ``after_release``: an owner-side report that runs once ``release/`` is written.
    ``in_driver``: a light stage the loop runs in its own process, never through the runner (which
    a Ray driver uses to place heavy stages).
    ``plan``: the events the stage will record, which the loop reserves before the first stage runs
    (``run_loop.reserve``); None: the stage reserves or records on its own."""

    name: str
    run: StageFn
    records: tuple[str, ...] = ()  # privacy events recorded in the ledger; () = none
    reads_private: bool = False
    isolated: bool = False  # run where no private data directory can be reached
    after_release: bool = False
    marks: tuple[str, ...] = ()
    in_driver: bool = False
    plan: PlanFn | None = None

    def __post_init__(self) -> None:
        unknown = set(self.records) - set(EVENT_KINDS)
        if unknown:
            raise ValueError(f"stage {self.name}: unknown privacy event kinds {sorted(unknown)}")
        if set(self.records) - {"post_processing"} and not self.reads_private:
            raise ValueError(f"stage {self.name}: records a DP event but says it reads no private data")
        if self.plan is not None and not set(self.records) - {"post_processing"}:
            raise ValueError(f"stage {self.name}: plans privacy events but declares none it records")
        if self.isolated and self.reads_private:
            raise ValueError(f"stage {self.name}: an isolated stage cannot read private data")

    def done(self, markers: StageMarkers) -> bool:
        return all(markers.done(m) for m in (self.marks or (self.name,)))


@dataclass(frozen=True)
class PrivacyPlan:
    """What the run's ledger is created with: public numbers only (m is the declared working-set size).

    ``delta`` None: the default rule (``privacy.default_delta``); an explicit delta must be below 1/m."""

    dataset: str
    epsilon: float  # math.inf: a non-private reference run (the config says not_private: true)
    delta: float | None
    public_size: int
    delta_field: str = "privacy.delta"
    budget: float | None = None  # the ledger's budget when it differs from epsilon (runs sharing one ledger)

    @property
    def is_reference(self) -> bool:
        return math.isinf(self.epsilon)


class UndeclaredPrivacyEvent(RuntimeError):
    """A stage recorded a kind of privacy event it did not declare: a programming error, never silent."""


class StageInterrupted(RuntimeError):
    """Raised after a config's ``stop_after_stage`` (tests simulate a crash with it)."""


class Method(ABC):
    """A method: a typed config and what the loop needs to know about it."""

    kind: ClassVar[str]  # "actg", "aim", ...: names the release manifest and the reference-run mark

    def __init__(self, config) -> None:
        self.config = config

    @abstractmethod
    def stages(self) -> list[Stage]:
        """The stages in order."""

    @abstractmethod
    def run_dir(self) -> Path:
        """Where the run lives: the config's ``output_dir`` (``name`` only labels the run)."""

    def former_run_dir(self) -> Path | None:
        """Where an older release ran this config, if elsewhere: a run found there and none in ``run_dir``
        is refused, naming the key that continues it (``run_loop.former``)."""
        return None

    @abstractmethod
    def privacy_plan(self) -> PrivacyPlan:
        """The pre-flight: config and whole private file checked, nothing written; the ledger's settings."""

    @abstractmethod
    def release_items(self, root: Path) -> Mapping[str, Path]:
        """Name in ``release/`` -> file or directory of the run: the DP outputs only."""

    def ledger_dir(self, root: Path) -> Path:
        """Where the run's ledger (and so its release) lives: the run directory, unless runs share a ledger."""
        return root

    def identity(self) -> tuple[dict, tuple[str, ...]]:
        """The config snapshot of the rerun rule and the keys that change how it runs, not what it outputs."""
        return self.config.model_dump(mode="json"), ()

    def release_name(self) -> str:
        """The method as the release manifest names it."""
        return self.kind

    def stop_after(self) -> str | None:
        """Test knob: the stage after which the loop stops as if killed."""
        return None


Runner = Callable[..., dict]


def local_runner(fn: StageFn, cfg, root: str, *, isolated: bool = False) -> dict:
    """Run a stage in this process (no Ray); the marker records where."""
    return {**(fn(cfg, root) or {}), "ran_on": {"host": socket.gethostname(), "in_process": True}}
