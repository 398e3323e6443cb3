"""What a run may publish: ``RUN_DIR/release/``, built once at the end of a run, copied by ``dpsynth release``.

A run directory mixes three kinds of files: DP outputs (synthetic data, the DP adapter, the
ledger), owner-only reports that read real records (metrics, evaluation plots, the DP-SGD loss
curve), and resumable state (checkpoints holding secret seeds). Only the first kind is safe to
hand out. Each pipeline names its DP outputs once, in :func:`write_release`; everything else
stays outside ``release/``, and ``dpsynth release RUN_DIR DEST`` copies nothing but that folder,
after checking every file against the manifest's hashes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path

from dpsynth_core.errors import ConfigError
from dpsynth_core.files import atomic_dir

RELEASE_DIRNAME = "release"
MANIFEST_FILE = "MANIFEST.json"
LEDGER_JSON = "ledger.json"
LEDGER_TEXT = "ledger.txt"


def release_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / RELEASE_DIRNAME


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def write_release(run_dir: str | Path, items: Mapping[str, str | Path], *, ledger, method: str) -> Path:
    """Build ``RUN_DIR/release/`` atomically from ``items`` (name in the release -> file or directory
    in the run), plus the ledger (JSON and text) and ``MANIFEST.json`` (sha256 of every file, the
    composed epsilon at delta, and whether the run is private at all)."""
    run_dir = Path(run_dir)
    missing = [str(src) for src in items.values() if not Path(src).exists()]
    if missing:
        raise ConfigError(f"{run_dir}: cannot build the release, missing outputs: {missing}")
    summary = ledger.to_dict()

    def build(staging: Path) -> None:
        for name, src in items.items():
            src, dst = Path(src), staging / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst)
            else:
                shutil.copy2(src, dst)
        (staging / LEDGER_JSON).write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
        (staging / LEDGER_TEXT).write_text(ledger.render(), encoding="utf-8")
        manifest = {
            "method": method,
            "dataset": summary["dataset"],
            # A reference run (epsilon = inf) has no DP epsilon: null, never the 0.0 its empty ledger sums to.
            "epsilon": None if summary.get("not_private") else summary["total_epsilon"],
            "epsilon_budget": summary["epsilon_budget"],
            "delta": summary["delta"],
            "not_private": summary.get("not_private", False),
            "files": {str(p.relative_to(staging)): _sha256(p) for p in _files(staging)},
        }
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2), encoding="utf-8")

    return atomic_dir(release_dir(run_dir), build)


def read_manifest(run_dir: str | Path) -> dict:
    path = release_dir(run_dir) / MANIFEST_FILE
    if not path.is_file():
        raise ConfigError(f"{run_dir}: no release (expected {path}); a run writes it when its last stage finishes")
    return json.loads(path.read_text(encoding="utf-8"))


def verify_release(run_dir: str | Path) -> dict:
    """The manifest, after checking that ``release/`` holds exactly its files with their hashes."""
    manifest = read_manifest(run_dir)
    root = release_dir(run_dir)
    present = {str(p.relative_to(root)) for p in _files(root)} - {MANIFEST_FILE}
    listed = set(manifest["files"])
    if present != listed:
        raise ConfigError(f"{root}: files differ from the manifest (extra: {sorted(present - listed)}, "
                          f"missing: {sorted(listed - present)}); rebuild the run's release")
    for name, digest in manifest["files"].items():
        if _sha256(root / name) != digest:
            raise ConfigError(f"{root / name}: changed since the release was written (sha256 mismatch)")
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
