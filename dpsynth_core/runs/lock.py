"""One process per run directory: an exclusive advisory lock on ``run_dir/.lock`` (Ray-free).

    with RunLock(run_dir):          # RunLockedError at once if another process holds it
        ...the whole run...

* ``fcntl.flock`` (non-blocking): the kernel drops the lock when the holding process exits or
  crashes, so a killed run never leaves a stale lock. On NFS, Linux emulates flock with POSIX
  record locks, so it also holds across the nodes of a cluster that share the run directory.
* The holder writes its pid, host and start time into the lock file; the error of a second
  process names the run directory and that holder.
* Re-entrant within one process (a driver that locks a run and then calls another entry that
  locks it too); a forked child does not inherit the holding (its own attempt is refused).
* Taken by the driver process that owns the run, never by its Ray tasks: they write their stage
  outputs or the ledger (SQLite has its own locking), so a run's tasks cannot deadlock on it.
* On release the lock file is removed, and the run directory too when the lock created it and
  nothing else was written (a run that fails its pre-flight leaves nothing behind). Removing the
  file is safe because an acquirer checks that the file it locked is still the one at the path.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path

from dpsynth_core.errors import DpsynthError

LOCK_FILE = ".lock"


class RunLockedError(DpsynthError):
    """Another process holds the run directory's lock."""


_HELD: dict[str, int] = {}  # lock path -> pid of this process while it holds the lock


def holder_info(run_dir: Path) -> dict:
    """What the holder wrote into the lock file ({} when unknown)."""
    try:
        return json.loads((Path(run_dir) / LOCK_FILE).read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}


class RunLock:
    """Exclusive lock on one run directory, held from ``acquire`` to ``release``."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None
        self._reentrant = False  # a nested holding in the process that already owns the run
        self._created_dirs: list[Path] = []  # the run dir and any parents this lock created, innermost first

    def _key(self) -> str:
        return os.path.realpath(self.path)

    def acquire(self) -> RunLock:
        if self.held:
            return self
        if _HELD.get(self._key()) == os.getpid():  # held by an outer `with` of this process
            self._reentrant = True
            return self
        missing = self.run_dir
        while not missing.exists():
            self._created_dirs.append(missing)
            missing = missing.parent
        while True:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # the directory was removed by a releasing holder: retry
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunLockedError(self._locked_message()) from None
            try:
                same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same_file = False
            if same_file:
                break
            os.close(fd)  # we locked a file a releasing holder just removed: take the new one
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "since": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        _HELD[self._key()] = os.getpid()
        return self

    def _locked_message(self) -> str:
        info = holder_info(self.run_dir)
        who = (f"pid {info.get('pid', '?')} on host {info.get('host', '?')}, since {info.get('since', '?')}"
               if info else "holder unknown")
        return (f"{self.run_dir}: another process is running this run ({who}); two processes must not write "
                "one run. Wait for it to finish or stop it (its lock goes away when it exits), or use another "
                "run directory")

    def release(self) -> None:
        if self._reentrant:  # the outer holding releases
            self._reentrant = False
            return
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        _HELD.pop(self._key(), None)
        try:
            self.path.unlink(missing_ok=True)  # while still locked: see the module doc
            for directory in self._created_dirs:  # innermost first; only when empty
                try:
                    directory.rmdir()  # a run that wrote nothing leaves nothing, not even runs/
                except OSError:
                    break
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    @property
    def held(self) -> bool:
        return self._fd is not None or self._reentrant

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def locked_run(run_dir_of):
    """Decorator for a pipeline entry: hold the run's lock for the whole call.

    ``run_dir_of(*args, **kwargs)`` gives the run directory from the entry's own arguments."""
    import functools

    def wrap(entry):
        @functools.wraps(entry)
        def run(*args, **kwargs):
            with RunLock(run_dir_of(*args, **kwargs)):
                return entry(*args, **kwargs)

        return run

    return wrap
