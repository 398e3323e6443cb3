"""Budget reservations of stages still running: the ``reservations`` table of a ledger.

``PrivacyLedger.reserve`` writes a row (the stage's event, who holds it) in the same transaction as
its budget check; every later check counts it; ``record`` turns it into the event; the end of the
``with`` block deletes it. A process that dies inside the block leaves its row behind, so a row is
*stale*, and cleared by the next reservation of any process, when:

* its host is this host and its process is gone (the pid is not running, or runs another program
  started since: the process start time is recorded too);
* its host is another host and its heartbeat (refreshed every ``HEARTBEAT_S`` by the holder) is
  older than ``STALE_AFTER_S``.

A stale row never lets a stage spend more than the budget: ``record`` checks again.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from dpsynth_core.privacy.events import event_from_dict

HEARTBEAT_S = 30.0
STALE_AFTER_S = 600.0
STALE_RULE = (f"a reservation is cleared when its process on this host is gone, or after {STALE_AFTER_S:g} s "
              "without a heartbeat from another host")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS reservations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    stage TEXT NOT NULL,
    kind TEXT NOT NULL,
    params TEXT NOT NULL,
    pid INTEGER NOT NULL,
    host TEXT NOT NULL,
    process_start TEXT NOT NULL,
    created TEXT NOT NULL,
    heartbeat REAL NOT NULL
)
"""


@dataclass(frozen=True)
class Reservation:
    id: int
    stage: str
    kind: str
    params: dict
    pid: int
    host: str
    process_start: str
    created: str
    heartbeat: float

    def event(self):
        return event_from_dict(self.kind, self.params)

    def describe(self) -> str:
        return f"{self.stage!r} ({self.kind}, pid {self.pid} on {self.host}, since {self.created})"


def process_start(pid: int) -> str:
    """The kernel's start time of ``pid`` ("" where /proc is not available or the pid is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]  # field 22 of stat(5), counted after "(comm)"


def _alive(pid: int, started: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        pass
    return not started or process_start(pid) in ("", started)


def is_stale(r: Reservation, now: float | None = None) -> bool:
    if r.host == socket.gethostname():
        return not _alive(r.pid, r.process_start)
    return (now or time.time()) - r.heartbeat > STALE_AFTER_S


def _has_table(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'reservations'").fetchone() is not None


def _rows(conn: sqlite3.Connection) -> list[Reservation]:
    if not _has_table(conn):
        return []
    rows = conn.execute("SELECT id, stage, kind, params, pid, host, process_start, created, heartbeat "
                        "FROM reservations ORDER BY id").fetchall()
    return [Reservation(r[0], r[1], r[2], json.loads(r[3]), *r[4:]) for r in rows]


def live_reservations(conn: sqlite3.Connection) -> list[Reservation]:
    now = time.time()
    return [r for r in _rows(conn) if not is_stale(r, now)]


def clear_stale(conn: sqlite3.Connection) -> None:
    """Delete stale rows (call inside the caller's write transaction)."""
    now = time.time()
    for r in _rows(conn):
        if is_stale(r, now):
            conn.execute("DELETE FROM reservations WHERE id = ?", (r.id,))


def insert_reservation(conn: sqlite3.Connection, stage: str, event) -> Reservation:
    """Insert this process's reservation (call inside the caller's write transaction)."""
    conn.execute(_SCHEMA)
    pid, host = os.getpid(), socket.gethostname()
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    params = event.params()
    cur = conn.execute(
        "INSERT INTO reservations (stage, kind, params, pid, host, process_start, created, heartbeat) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (stage, event.kind, json.dumps(params, sort_keys=True), pid, host, process_start(pid), created, time.time()),
    )
    return Reservation(cur.lastrowid, stage, event.kind, params, pid, host, process_start(pid), created, time.time())


def delete_reservation(conn: sqlite3.Connection, reservation_id: int) -> None:
    if _has_table(conn):
        conn.execute("DELETE FROM reservations WHERE id = ?", (reservation_id,))


class Heartbeat:
    """Refreshes a reservation's heartbeat from a daemon thread until ``stop()``, or until its row is gone
    (recorded, given back or cleared: nothing is left to keep alive)."""

    def __init__(self, ledger_path: Path, reservation_id: int, every_s: float | None = None) -> None:
        self._path, self._id, self._every = ledger_path, reservation_id, HEARTBEAT_S if every_s is None else every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ledger-reservation-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                with closing(sqlite3.connect(self._path, timeout=60.0, isolation_level=None)) as conn:
                    beat = conn.execute("UPDATE reservations SET heartbeat = ? WHERE id = ?", (time.time(), self._id))
            except sqlite3.Error:
                continue  # a missed beat only makes the row look older to other hosts
            if beat.rowcount == 0:
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
