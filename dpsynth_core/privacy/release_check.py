"""A release states the run's ledger, or nothing: ``RUN_DIR/release/`` checked against ``ledger.sqlite``.

``dpsynth release`` copies a run's ``release/`` only after :func:`verify_release`: every file's hash
(``runs.release.verify_files``) and the manifest and ``ledger.json`` against the run's ledger (the same
composed epsilon, budget, delta, not-private mark and list of entries), so a stale release is never
published with a smaller epsilon than the run spent.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy.ledger import LEDGER_FILE, PrivacyLedger
from dpsynth_core.runs.files import atomic_dir
from dpsynth_core.runs.release import LEDGER_JSON, release_dir, verify_files


def _entry_list(entries) -> list[str]:
    """Stage, kind, parameters and epsilon of each entry, comparable across JSON round trips."""
    return [json.dumps([e["stage"], e["kind"], e["params"], round(float(e["epsilon"]), 9)], sort_keys=True)
            for e in entries]


def check_release_matches_ledger(run_dir: str | Path, manifest: dict) -> None:
    """Refuse a release whose manifest or ledger files disagree with the run's ``ledger.sqlite``
    (epsilon, budget, delta, the not-private mark, or the list of entries): it would publish a
    guarantee the run's privacy spend does not support (a DP sweep's trial release, say)."""
    run_dir = Path(run_dir)
    if not (run_dir / LEDGER_FILE).is_file():
        raise ConfigError(f"{run_dir}: no {LEDGER_FILE} next to release/; the release cannot be checked "
                          "against the run's privacy spend")
    ledger = PrivacyLedger.open(run_dir)
    private = ledger.is_private
    total = ledger.total_epsilon()
    published = json.loads((release_dir(run_dir) / LEDGER_JSON).read_text(encoding="utf-8"))
    problems = []
    if bool(manifest.get("not_private")) != (not private):
        problems.append("the not-private mark")
    if private and not (manifest.get("epsilon") is not None and math.isclose(manifest["epsilon"], total, rel_tol=1e-6)):
        problems.append(f"epsilon (manifest {manifest.get('epsilon')}, ledger.sqlite {total:.6g})")
    if not math.isclose(float(published["total_epsilon"]), total, rel_tol=1e-6, abs_tol=1e-12):
        problems.append(f"epsilon in {LEDGER_JSON} ({published['total_epsilon']}, ledger.sqlite {total:.6g})")
    for key, value in (("epsilon_budget", ledger.epsilon_budget), ("delta", ledger.delta)):
        if not math.isclose(float(manifest[key]), value, rel_tol=1e-9):
            problems.append(f"{key} (manifest {manifest[key]}, ledger.sqlite {value:g})")
    sqlite_entries = [{"stage": e.stage, "kind": e.kind, "params": e.params, "epsilon": e.epsilon}
                      for e in ledger.entries()]
    if _entry_list(published["entries"]) != _entry_list(sqlite_entries):
        problems.append(f"the list of ledger entries ({LEDGER_JSON}: {[e['stage'] for e in published['entries']]}, "
                        f"ledger.sqlite: {[e['stage'] for e in sqlite_entries]})")
    if problems:
        raise ConfigError(f"{release_dir(run_dir)}: disagrees with {run_dir / LEDGER_FILE} on {'; '.join(problems)}; "
                          "it would publish a privacy guarantee the run's ledger does not state. Rebuild the "
                          "release (a DP sweep rebuilds its best trial's release after selection)")


def verify_release(run_dir: str | Path) -> dict:
    """The manifest, after checking every file's hash and that it states what ``ledger.sqlite`` does."""
    manifest = verify_files(run_dir)
    check_release_matches_ledger(run_dir, manifest)
    return manifest


def copy_release(run_dir: str | Path, dest: str | Path) -> dict:
    """Copy ``RUN_DIR/release/`` (verified) to ``dest``, which must not exist or be empty."""
    manifest = verify_release(run_dir)
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigError(f"{dest}: destination exists and is not an empty directory")
    if dest.exists():
        dest.rmdir()
    atomic_dir(dest, lambda staging: shutil.copytree(release_dir(run_dir), staging, dirs_exist_ok=True))
    return manifest
