"""Run directory lock: a second process is refused with the holder named; a crash releases it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpsynth_core.runs.lock import LOCK_FILE, RunLock, RunLockedError, locked_run

REPO = Path(__file__).resolve().parent.parent
TRY_LOCK = """
    import sys
    from dpsynth_core.runs.lock import RunLock, RunLockedError
    try:
        RunLock(sys.argv[1]).acquire()
    except RunLockedError as exc:
        print("refused:", exc)
        sys.exit(2)
    print("locked", flush=True)
    if sys.argv[2:] == ["crash"]:
        import os; os._exit(3)  # dies holding the lock, no cleanup
"""


def _try_lock(run: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(TRY_LOCK), str(run), *extra], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_second_process_is_refused_naming_the_run_and_the_holder(tmp_path):
    run = tmp_path / "run"
    with RunLock(run):
        proc = _try_lock(run)
    assert proc.returncode == 2, proc.stderr
    message = proc.stdout
    assert str(run) in message and f"pid {os.getpid()} on host {socket.gethostname()}" in message
    assert "another process is running this run" in message
    assert _try_lock(run).returncode == 0  # released: the next process gets it


def test_a_crashed_holder_releases_the_lock(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    crashed = _try_lock(run, "crash")
    assert crashed.returncode == 3 and "locked" in crashed.stdout
    assert (run / LOCK_FILE).is_file()  # left behind by the crash, but no longer locked
    with RunLock(run) as lock:
        assert lock.held


def test_reentrant_in_one_process_and_nothing_left_behind(tmp_path):
    run = tmp_path / "new"

    @locked_run(lambda root: root)
    def entry(root: Path) -> bool:
        with RunLock(root):  # an inner entry of the same process: not a second owner
            pass
        return (root / LOCK_FILE).is_file()  # the outer holding is still in force

    assert entry(run) is True
    assert not run.exists()  # the lock created the directory and nothing else was written: removed
    run.mkdir()
    (run / "config.yaml").write_text("x: 1\n")
    with RunLock(run):
        pass
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]


def test_fresh_moves_the_old_run_aside_but_keeps_the_lock(tmp_path):
    from dpsynth_core.runs import open_run_dir

    run = tmp_path / "run"
    open_run_dir(run, {"epsilon": 1.0}, resume=True)
    (run / "out.txt").write_text("old")
    with RunLock(run):
        open_run_dir(run, {"epsilon": 2.0}, resume=False)
        assert _try_lock(run).returncode == 2  # still locked after the move
        assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE, "config.yaml"]
    (aside,) = tmp_path.glob("run.prev-*")
    assert sorted(p.name for p in aside.iterdir()) == ["config.yaml", "out.txt"]


def test_forked_child_does_not_inherit_the_holding(tmp_path):
    import multiprocessing

    run = tmp_path / "run"
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()

    def child() -> None:
        try:
            RunLock(run).acquire()
            queue.put("locked")
        except RunLockedError:
            queue.put("refused")

    with RunLock(run):
        proc = ctx.Process(target=child)
        proc.start()
        proc.join(60)
        assert queue.get(timeout=5) == "refused"
