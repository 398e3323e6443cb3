"""The privacy ledger of one private data set: a SQLite file ``run_dir/ledger.sqlite``.

Every mechanism that touches the private data records an event; the ledger composes all events
into one (epsilon, delta) (see ``composition``), refuses a stage that would exceed the budget
*before* anything is written, and persists each record in one transaction, so another process
opening the same run directory sees the same totals.

Pattern for a DP stage::

    ledger.check(stage, event)   # before touching the data; raises BudgetExceededError
    ...run the mechanism...
    ledger.record(stage, event)  # checks again and persists atomically

A long stage that other processes could race for the same budget (two ``dpsynth train`` runs on
one ledger) reserves its event first, so the loser is refused before it reads private data::

    with ledger.reserve(stage, event):  # BudgetExceededError now, not after training
        ...run the mechanism...
        ledger.record(stage, event)     # converts the reservation into the event

(``hold``/``release`` are the same without a block, for a reservation made in one function and
converted or given back in another; ``adopt`` hands one to another process, e.g. the run loop's to its stage.)

A reservation is checked and written in one ``BEGIN IMMEDIATE`` transaction and counts in every
later check, reservation and record of other processes (see ``reservations.py`` for how the
reservations of dead processes are cleared).

A run that used a test-only shortcut (a fixed sampling/noise seed, a simulated crash, noise
switched off: epsilon = inf) calls ``ledger.mark_not_private(stage, reason)``; the mark is
permanent, and ``render()``, ``to_dict()`` and ``dpsynth ledger show`` state it above the totals.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dpsynth_core.errors import BudgetExceededError, ConfigError
from dpsynth_core.privacy._validate import check_delta, check_positive
from dpsynth_core.privacy.composition import compose_upper_bound, compose_with_details
from dpsynth_core.privacy.events import (
    DpSgdEvent,
    GaussianEvent,
    PostProcessingEvent,
    SelectionEvent,
    ZCdpEvent,
    event_from_dict,
)
from dpsynth_core.privacy.ledger_render import render_ledger
from dpsynth_core.privacy.reservations import (
    STALE_RULE,
    Heartbeat,
    Reservation,
    clear_stale,
    delete_reservation,
    insert_reservation,
    live_reservations,
)

LEDGER_FILE = "ledger.sqlite"
SCHEMA_VERSION = 1
_EVENT_TYPES = (DpSgdEvent, GaussianEvent, ZCdpEvent, PostProcessingEvent, SelectionEvent)
_TOLERANCE = 1e-9  # relative slack for float round-off when comparing with the budget

_SCHEMA = """
CREATE TABLE meta (
    schema_version INTEGER NOT NULL,
    dataset TEXT NOT NULL,
    epsilon_budget REAL NOT NULL,
    delta REAL NOT NULL,
    created TEXT NOT NULL
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    stage TEXT NOT NULL,
    kind TEXT NOT NULL,
    params TEXT NOT NULL,
    epsilon_alone REAL NOT NULL,
    total_epsilon_after REAL NOT NULL,
    details TEXT NOT NULL,
    timestamp TEXT NOT NULL
);
"""
# Added after schema version 1 without a version bump: created on first use, absent means "none".
_PUBLIC_SIZE_SCHEMA = "CREATE TABLE IF NOT EXISTS public_size (m INTEGER NOT NULL);"
_NOT_PRIVATE_SCHEMA = """
CREATE TABLE IF NOT EXISTS not_private (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    stage TEXT NOT NULL,
    reason TEXT NOT NULL,
    timestamp TEXT NOT NULL,
    UNIQUE (stage, reason)
);
"""


@dataclass(frozen=True)
class LedgerEntry:
    """One recorded event."""

    id: int
    stage: str
    kind: str
    params: dict[str, Any]
    epsilon: float  # this event alone, at the ledger's delta
    total_epsilon_after: float  # composed total once this event was recorded
    timestamp: str | None  # None in a DP sweep's release (no trial's time)
    details: dict[str, Any] = field(default_factory=dict)

    def event(self):
        """The event object this entry was recorded from."""
        return event_from_dict(self.kind, self.params)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _connect(path: Path) -> sqlite3.Connection:
    # Autocommit mode; writes use explicit BEGIN IMMEDIATE so check+insert is one transaction.
    return sqlite3.connect(path, timeout=60.0, isolation_level=None)


def _make_durable(path: Path) -> None:
    """An object-store run (s3://, gs://) uploads its ledger now, before the event's output is released."""
    from dpsynth_core.runs.storage_sync import make_durable

    make_durable(path.parent, path)


class PrivacyLedger:
    """Persistent record of every privacy-relevant event of one private data set."""

    def __init__(self, path: Path, dataset: str, epsilon_budget: float, delta: float, created: str):
        self.path = Path(path)
        self.dataset = dataset
        self.epsilon_budget = float(epsilon_budget)
        self.delta = float(delta)
        self.created = created
        self._held: dict[str, int] = {}  # stage -> id of the reservation this object holds
        self._heartbeats: dict[str, Heartbeat] = {}

    def __getstate__(self) -> dict:
        # a copy in another process (a Ray task) holds no reservation: it belongs to this process
        return {**self.__dict__, "_held": {}, "_heartbeats": {}}

    # ----------------------------------------------------------------------------- lifecycle
    @classmethod
    def create(cls, run_dir: str | Path, dataset: str, epsilon_budget: float, delta: float,
               public_size: int | None = None) -> PrivacyLedger:
        """Create ``run_dir/ledger.sqlite``. If one exists with the same dataset, budget and delta
        it is reopened (resume); with different ones, ConfigError. ``public_size``: the public
        working-set size m (never a drawn or file count), shown with m * delta."""
        epsilon_budget = check_positive("epsilon_budget", epsilon_budget)
        delta = check_delta(delta)
        if not dataset or not isinstance(dataset, str):
            raise ConfigError("ledger dataset name must be a non-empty string")
        run_dir = Path(run_dir)
        path = run_dir / LEDGER_FILE
        if path.exists():
            ledger = cls.open(run_dir)
            same = (
                ledger.dataset == dataset
                and math.isclose(ledger.epsilon_budget, epsilon_budget, rel_tol=1e-12)
                and math.isclose(ledger.delta, delta, rel_tol=1e-12)
            )
            if not same:
                raise ConfigError(
                    f"{path}: a ledger already exists for dataset={ledger.dataset!r}, "
                    f"epsilon_budget={ledger.epsilon_budget}, delta={ledger.delta:g}; it does not match "
                    f"dataset={dataset!r}, epsilon_budget={epsilon_budget}, delta={delta:g}. "
                    "Use a new run directory."
                )
            return ledger
        run_dir.mkdir(parents=True, exist_ok=True)
        created = _now()
        # Build in a temp file and rename: never a half-written ledger.
        fd, tmp = tempfile.mkstemp(prefix=".ledger-", suffix=".sqlite", dir=run_dir)
        os.close(fd)
        try:
            with closing(sqlite3.connect(tmp)) as conn:
                conn.executescript(_SCHEMA)
                conn.execute(
                    "INSERT INTO meta VALUES (?, ?, ?, ?, ?)",
                    (SCHEMA_VERSION, dataset, epsilon_budget, delta, created),
                )
                if public_size is not None:
                    conn.executescript(_PUBLIC_SIZE_SCHEMA)
                    conn.execute("INSERT INTO public_size VALUES (?)", (int(public_size),))
                conn.commit()
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return cls(path, dataset, epsilon_budget, delta, created)

    @classmethod
    def open(cls, run_dir: str | Path) -> PrivacyLedger:
        """Open the ledger of an existing run directory."""
        path = Path(run_dir) / LEDGER_FILE
        if not path.is_file():
            raise ConfigError(f"{path}: no privacy ledger here (is {run_dir} a dpsynth run directory?)")
        try:
            with closing(_connect(path)) as conn:
                row = conn.execute(
                    "SELECT schema_version, dataset, epsilon_budget, delta, created FROM meta"
                ).fetchone()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"{path}: not a readable privacy ledger ({exc})") from None
        if row is None:
            raise ConfigError(f"{path}: ledger has no meta row")
        version, dataset, budget, delta, created = row
        if version != SCHEMA_VERSION:
            raise ConfigError(f"{path}: ledger schema version {version}, expected {SCHEMA_VERSION}")
        return cls(path, dataset, budget, delta, created)

    # ----------------------------------------------------------------------------- reading
    def entries(self) -> list[LedgerEntry]:
        """All recorded events, oldest first."""
        with closing(_connect(self.path)) as conn:
            return self._entries(conn)

    @staticmethod
    def _entries(conn: sqlite3.Connection) -> list[LedgerEntry]:
        rows = conn.execute(
            "SELECT id, stage, kind, params, epsilon_alone, total_epsilon_after, timestamp, details "
            "FROM events ORDER BY id"
        ).fetchall()
        return [
            LedgerEntry(
                id=r[0], stage=r[1], kind=r[2], params=json.loads(r[3]), epsilon=r[4],
                total_epsilon_after=r[5], timestamp=r[6], details=json.loads(r[7]),
            )
            for r in rows
        ]

    def events(self) -> list:
        """The recorded events as event objects."""
        return [e.event() for e in self.entries()]

    def not_private_reasons(self) -> list[dict[str, str]]:
        """Every ``mark_not_private`` of this run (stage, reason, timestamp), oldest first."""
        with closing(_connect(self.path)) as conn:
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'not_private'"
            ).fetchone()
            if not exists:
                return []
            rows = conn.execute("SELECT stage, reason, timestamp FROM not_private ORDER BY id").fetchall()
        return [{"stage": r[0], "reason": r[1], "timestamp": r[2]} for r in rows]

    @property
    def public_size(self) -> int | None:
        """The public working-set size m the run declared (None for a ledger made without one)."""
        with closing(_connect(self.path)) as conn:
            exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'public_size'").fetchone()
            row = conn.execute("SELECT m FROM public_size").fetchone() if exists else None
        return int(row[0]) if row else None

    @property
    def is_private(self) -> bool:
        """False once any stage marked the run not private: its epsilon is then not a guarantee."""
        return not self.not_private_reasons()

    def _compose(self, events: list) -> tuple[float, str, dict[str, float]]:
        return compose_with_details(events, self.delta)

    def total_epsilon(self) -> float:
        """Composed epsilon of everything recorded, at the ledger's delta."""
        return self._compose(self.events())[0]

    def remaining_epsilon(self) -> float:
        """Budget left (never negative)."""
        return max(0.0, self.epsilon_budget - self.total_epsilon())

    # ----------------------------------------------------------------------------- writing
    @staticmethod
    def _validate(stage: str, event) -> None:
        if not isinstance(stage, str) or not stage.strip():
            raise ConfigError("ledger stage name must be a non-empty string")
        if not isinstance(event, _EVENT_TYPES):
            raise ConfigError(
                f"stage {stage!r}: unknown privacy event type {type(event).__name__}; expected one of "
                + ", ".join(t.__name__ for t in _EVENT_TYPES)
            )

    def _projected(self, stage: str, event, existing: list, reserved: list[Reservation] = ()) -> float:
        projected = self._compose([*existing, *(r.event() for r in reserved), event])[0]
        if not projected <= self.epsilon_budget * (1.0 + _TOLERANCE):
            in_flight = ("; reserved by stages still running: " + ", ".join(r.describe() for r in reserved)
                         + f" ({STALE_RULE})") if reserved else ""
            raise BudgetExceededError(
                f"stage {stage!r} ({event.kind}) refused: it would take the privacy spend of dataset "
                f"{self.dataset!r} to epsilon={projected:.4f} (delta={self.delta:g}), over the budget "
                f"epsilon={self.epsilon_budget:g}; already spent {self._compose(existing)[0]:.4f}{in_flight}"
            )
        return projected

    def _others_reservations(self, conn: sqlite3.Connection, stage: str) -> list[Reservation]:
        """Live reservations except the one this object holds for ``stage``."""
        own = self._held.get(stage)
        return [r for r in live_reservations(conn) if r.id != own]

    def projected_epsilon(self, event, upper_bound: bool = False) -> float:
        """Composed epsilon of the recorded events plus ``event`` (no budget check, writes nothing);
        ``upper_bound``: ``compose_upper_bound``'s faster figure, for searches."""
        events = [*self.events(), event]
        return compose_upper_bound(events, self.delta) if upper_bound else self._compose(events)[0]

    def check(self, stage: str, event) -> float:
        """Projected total epsilon if ``event`` were recorded (with the reservations of stages still
        running); BudgetExceededError if over budget. Writes nothing."""
        self._validate(stage, event)
        with closing(_connect(self.path)) as conn:
            existing = [e.event() for e in self._entries(conn)]
            return self._projected(stage, event, existing, self._others_reservations(conn, stage))

    def reservations(self) -> list[Reservation]:
        """Reservations of stages still running (those of dead processes left out)."""
        with closing(_connect(self.path)) as conn:
            return live_reservations(conn)

    def hold(self, stage: str, event) -> Reservation:
        """Reserve ``event``'s budget for ``stage`` until ``record(stage, ...)`` or ``release(stage)``.

        Refused (BudgetExceededError) unless the recorded events, every other live reservation and
        ``event`` fit the budget; checked and written in one transaction, so of two processes that
        race for the last of the budget exactly one gets it. A crash leaves a row that
        ``reservations.py`` clears. Prefer ``with ledger.reserve(...)``."""
        self._validate(stage, event)
        if stage in self._held:
            raise ConfigError(f"stage {stage!r}: this ledger already holds a reservation for it")
        with closing(_connect(self.path)) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                clear_stale(conn)
                existing = [e.event() for e in self._entries(conn)]
                self._projected(stage, event, existing, live_reservations(conn))
                held = insert_reservation(conn, stage, event)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        self._held[stage] = held.id
        self._heartbeats[stage] = Heartbeat(self.path, held.id)
        return held

    def adopt(self, stage: str, reservation_id: int) -> None:
        """Take over the live reservation another ledger object made for ``stage`` (the run loop's, for its stage);
        this object beats it from now on (on an object-store run the loop pauses its own: ``heartbeats_paused``)."""
        with closing(_connect(self.path)) as conn:
            if not any(r.id == reservation_id and r.stage == stage for r in live_reservations(conn)):
                raise ConfigError(f"stage {stage!r}: the run's budget reservation {reservation_id} is gone")
        self._held[stage] = reservation_id
        self._heartbeats[stage] = Heartbeat(self.path, reservation_id)

    @contextmanager
    def heartbeats_paused(self) -> Iterator[None]:
        """No beat from this object in the block: one writer per run while a stage runs on another node with its
        own copy of an object-store run (``runs.storage_sync``); the stage beats what it adopted."""
        for beat in self._heartbeats.values():
            beat.stop()
        try:
            yield
        finally:
            self._heartbeats = {stage: Heartbeat(self.path, rid) for stage, rid in self._held.items()}

    def held_event(self, stage: str):
        """The event this object holds a reservation for under ``stage`` (None when it holds none)."""
        if stage not in self._held:
            return None
        with closing(_connect(self.path)) as conn:
            return next((r.event() for r in live_reservations(conn) if r.id == self._held.get(stage)), None)

    def release(self, stage: str) -> None:
        """Give back ``stage``'s reservation if ``record`` has not converted it (no-op otherwise)."""
        held = self._held.pop(stage, None)
        beat = self._heartbeats.pop(stage, None)
        if beat is not None:
            beat.stop()
        if held is not None:
            with closing(_connect(self.path)) as conn:
                delete_reservation(conn, held)

    @contextmanager
    def reserve(self, stage: str, event) -> Iterator[Reservation]:
        """``hold`` for the block; released when it ends without a ``record`` (failure, interruption)."""
        held = self.hold(stage, event)
        try:
            yield held
        finally:
            self.release(stage)

    def record(self, stage: str, event, details: dict | None = None) -> float:
        """Check against the budget and persist ``event`` in one transaction; returns the new total."""
        self._validate(stage, event)
        try:
            details_json = json.dumps(details or {}, default=str, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"stage {stage!r}: ledger details must be JSON-serialisable ({exc})") from None
        eps_alone = event.epsilon(self.delta)
        with closing(_connect(self.path)) as conn:
            conn.execute("BEGIN IMMEDIATE")  # lock: no other process records between check and insert
            try:
                existing = [e.event() for e in self._entries(conn)]
                total = self._projected(stage, event, existing, self._others_reservations(conn, stage))
                conn.execute(
                    "INSERT INTO events (stage, kind, params, epsilon_alone, total_epsilon_after, details, timestamp) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (stage, event.kind, json.dumps(event.params(), sort_keys=True), eps_alone, total,
                     details_json, _now()),
                )
                if stage in self._held:  # the reservation becomes this event, in the same transaction
                    delete_reservation(conn, self._held[stage])
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        self._held.pop(stage, None)
        self.release(stage)  # stops the heartbeat; the row went with the event's transaction
        _make_durable(self.path)
        return total

    def mark_not_private(self, stage: str, reason: str) -> None:
        """Mark the whole run "not private" (permanent; the same stage and reason are kept once).

        For test-only knobs: DP randomness from a public seed, a simulated crash, no noise. The
        reason is shown next to every total; it must name the knob, never a private value.
        """
        if not isinstance(stage, str) or not stage.strip():
            raise ConfigError("ledger stage name must be a non-empty string")
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError(f"stage {stage!r}: mark_not_private needs a reason")
        with closing(_connect(self.path)) as conn:
            conn.executescript(_NOT_PRIVATE_SCHEMA)
            conn.execute("INSERT OR IGNORE INTO not_private (stage, reason, timestamp) VALUES (?, ?, ?)",
                         (stage, reason, _now()))
        _make_durable(self.path)

    # ----------------------------------------------------------------------------- reporting
    def to_dict(self, timestamps: bool = True) -> dict[str, Any]:
        """Everything, JSON-ready (for metrics.json); ``timestamps=False`` sets every time to None."""
        entries = self.entries()
        total, method, candidates = self._compose([e.event() for e in entries])
        not_private = self.not_private_reasons()
        if not timestamps:
            entries = [replace(e, timestamp=None) for e in entries]
            not_private = [{**mark, "timestamp": None} for mark in not_private]
        return {
            "dataset": self.dataset,
            "private": not not_private,
            "not_private": not_private,
            "epsilon_budget": self.epsilon_budget,
            "delta": self.delta,
            "public_size": (m := self.public_size),
            "m_times_delta": m * self.delta if m else None,
            "created": self.created if timestamps else None,
            "total_epsilon": total,
            "remaining_epsilon": max(0.0, self.epsilon_budget - total),
            "composition_method": method,
            "composition_candidates": candidates,
            "sum_of_event_epsilons": sum(e.epsilon for e in entries),
            "entries": [asdict(e) for e in entries],
        }

    def render(self, timestamps: bool = True) -> str:
        """A human table: one row per event, then the composed total against the budget (``ledger_render``)."""
        return render_ledger(self, timestamps)
