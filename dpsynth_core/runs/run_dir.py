"""One rerun rule for every pipeline's run directory, and its stage markers (Ray-free).

    root = open_run_dir(Path("runs/dpfair/x"), cfg.model_dump(mode="json"), resume=True,
                        ignore=("use_ray", "resources"))

* no directory yet: create it and write ``config.yaml`` (the validated config, canonical YAML);
* ``resume=False`` (``--fresh``): an existing directory is moved aside (``NAME.prev-STAMP``), then
  as above;
* the directory exists with another config: refuse, naming the changed keys, and suggest
  ``--fresh``. ``config.yaml`` is never overwritten, so a run never claims an epsilon that its
  data and ledger were not made with;
* the same config: resume (the caller skips finished stages; :func:`announce_finished` says so
  when there is nothing left).

Keys in ``ignore`` (dotted paths) change how a run executes, not what it outputs.

Each entry holds the run's lock (``runs.lock.RunLock``) around all of this, so the rule is decided
by one process at a time; ``--fresh`` moves the old files but leaves the lock file in place.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from collections.abc import Mapping
from pathlib import Path

import yaml

from dpsynth_core.errors import ConfigError
from dpsynth_core.runs.files import atomic_write_text

CONFIG_FILE = "config.yaml"


def _flatten(value, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict) and value:
        out: dict[str, object] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def changed_keys(old: dict, new: dict, ignore: tuple[str, ...] = ()) -> list[str]:
    """Dotted keys whose values differ between two config snapshots (minus ``ignore`` and below). A key the
    old snapshot lacks and the new one leaves at None is a setting added in a later version and left unset
    (new settings default to None = the old behaviour), not a change: a run interrupted before an upgrade
    still resumes."""
    a, b = _flatten(old), _flatten(new)
    skip = lambda k: any(k == i or k.startswith(i + ".") for i in ignore)  # noqa: E731
    added_unset = lambda k: k not in a and b.get(k) is None  # noqa: E731
    return sorted(k for k in set(a) | set(b)
                  if not skip(k) and not added_unset(k) and a.get(k, "<unset>") != b.get(k, "<unset>"))


def snapshot_text(snapshot: dict) -> str:
    return yaml.safe_dump(json.loads(json.dumps(snapshot, default=str)), sort_keys=True)


def open_run_dir(root: Path, snapshot: dict, *, resume: bool, ignore: tuple[str, ...] = (),
                 moved: Mapping[str, str] | None = None) -> Path:
    """Create, reopen or (``resume=False``) replace the run directory ``root``; see the module doc."""
    root = Path(root)
    text = snapshot_text(snapshot)
    if not resume:
        move_aside(root)
    if refuse_changed_config(root, snapshot, ignore, moved):
        return root
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(root / CONFIG_FILE, text)
    return root


def move_aside(root: Path) -> Path | None:
    """``--fresh``: move an old run's files into ``NAME.prev-STAMP`` (None when there are none).

    The run lock file stays: the process that holds it keeps the run directory locked."""
    from dpsynth_core.runs.lock import LOCK_FILE

    old = [p for p in root.iterdir() if p.name != LOCK_FILE] if root.is_dir() else []
    if not old:
        return None
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    aside, n = root.with_name(f"{root.name}.prev-{stamp}"), 1
    while aside.exists():  # two --fresh runs within a second
        aside, n = root.with_name(f"{root.name}.prev-{stamp}-{n}"), n + 1
    aside.mkdir()
    for path in old:
        os.replace(path, aside / path.name)
    return aside


class MovedKeysRun(ConfigError):
    """The run directory holds a run whose config differs only by keys that moved since it was made."""


def _only_moved(diff: list[str], moved: Mapping[str, str]) -> list[str]:
    """The moves (``old -> new``) that explain every changed key, or [] when some change is not a move."""
    places = {p for pair in moved.items() for p in pair}
    if not diff or not all(any(k == p or k.startswith(p + ".") for p in places) for k in diff):
        return []
    return [f"{o} -> {n}" for o, n in moved.items() if any(k == o or k.startswith(o + ".") for k in diff)]


def refuse_changed_config(root: Path, snapshot: dict, ignore: tuple[str, ...] = (),
                          moved: Mapping[str, str] | None = None) -> bool:
    """True when ``root`` already holds a run of this config; ConfigError (naming the changed keys
    and suggesting ``--fresh``) when it holds one of another config; False when it holds none.
    ``moved``: the config class's keys moved since an older release (old -> new dotted key): a run made
    before the move is named as such, in one line. Reads only; creates nothing."""
    config_file = Path(root) / CONFIG_FILE
    if not config_file.is_file():
        return False
    old = yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}
    diff = changed_keys(old, yaml.safe_load(snapshot_text(snapshot)), ignore)
    moves = _only_moved(diff, moved or {})
    if moves:
        raise MovedKeysRun(f"{root}: this run was made before its config keys moved ({', '.join(moves)}) and cannot "
                           "resume under the new ones; rerun with --fresh (the old run and its ledger are moved aside; "
                           "the new run spends its budget again)")
    if diff:
        raise ConfigError(
            f"{root}: this run was made with a different config (changed: {', '.join(diff)}); its outputs and "
            "ledger belong to the old one. Re-run with --fresh (the old run is moved aside) or set another name")
    return True


def announce_finished(root: Path) -> None:
    """One line on stderr: a rerun of a finished run does nothing and says so."""
    print(f"{root}: this run is already finished; nothing was run (--fresh starts it again)", file=sys.stderr)


class StageMarkers:
    """``stages/<name>.done`` files: written atomically after a stage's outputs are in place."""

    def __init__(self, root: Path) -> None:
        self.dir = Path(root) / "stages"

    def path(self, stage: str) -> Path:
        return self.dir / f"{stage}.done"

    def done(self, stage: str) -> bool:
        return self.path(stage).is_file()

    def summary(self, stage: str) -> dict:
        return json.loads(self.path(stage).read_text()) if self.done(stage) else {}

    def mark(self, stage: str, summary: dict | None = None) -> None:
        finished = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        atomic_write_text(self.path(stage), json.dumps({"stage": stage, "finished": finished, **(summary or {})},
                                                       indent=2, default=str))
