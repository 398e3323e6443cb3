"""What a run may publish: ``RUN_DIR/release/``, built once at the end of a run, copied by ``dpsynth release``.

A run directory mixes three kinds of files: DP outputs (synthetic data, the DP adapter, the
ledger), owner-only reports that read real records (metrics, evaluation plots, the DP-SGD loss
curve), and resumable state (checkpoints holding secret seeds). Only the first kind is safe to
hand out. Each pipeline names its DP outputs once, in :func:`write_release`; everything else
stays outside ``release/``, and ``dpsynth release RUN_DIR DEST`` copies nothing but that folder,
after checking every file against the manifest's hashes and the manifest against the run's ledger
(``dpsynth_core.privacy.release_check``: this module sits below the ledger and takes the ledger
object its caller opened).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path

from dpsynth_core.errors import ConfigError
from dpsynth_core.runs.files import atomic_dir

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


def write_release(run_dir: str | Path, items: Mapping[str, str | Path], *, ledger, method: str,
                  timestamps: bool = True) -> Path:
    """Build ``RUN_DIR/release/`` atomically from ``items`` (name in the release -> file or directory
    in the run), plus the ledger (JSON and text) and ``MANIFEST.json`` (sha256 of every file, the
    composed epsilon at delta, and whether the run is private at all). ``timestamps=False`` leaves
    the ledger's times out (a DP sweep's release: a trial's times would hint at how many ran)."""
    run_dir = Path(run_dir)
    missing = [str(src) for src in items.values() if not Path(src).exists()]
    if missing:
        raise ConfigError(f"{run_dir}: cannot build the release, missing outputs: {missing}")
    summary = ledger.to_dict(timestamps=timestamps)

    def build(staging: Path) -> None:
        for name, src in items.items():
            src, dst = Path(src), staging / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst)
            else:
                shutil.copy2(src, dst)
        (staging / LEDGER_JSON).write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
        (staging / LEDGER_TEXT).write_text(ledger.render(timestamps=timestamps), encoding="utf-8")
        manifest = {
            "method": method,
            "dataset": summary["dataset"],
            # A reference run (epsilon = inf) has no DP epsilon: null, never the 0.0 its empty ledger sums to.
            "epsilon": None if summary.get("not_private") else summary["total_epsilon"],
            "epsilon_budget": summary["epsilon_budget"],
            "delta": summary["delta"],
            # m * delta with the public working-set size m (never the file's row count): keep it well below 1
            "public_size": summary.get("public_size"),
            "m_times_delta": summary.get("m_times_delta"),
            "not_private": summary.get("not_private", False),
            "files": {str(p.relative_to(staging)): _sha256(p) for p in _files(staging)},
        }
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2), encoding="utf-8")

    return atomic_dir(release_dir(run_dir), build)


def rebuild_release(run_dir: str | Path, ledger, *, timestamps: bool = False) -> Path:
    """Rewrite ``RUN_DIR/release/`` around ``ledger``: the same outputs (checked against the old
    manifest first), new ledger files and a new manifest. A DP sweep calls it once the best trial's
    ledger holds the selection event, so what is published states the selection's epsilon."""
    old = verify_files(run_dir)
    root = release_dir(run_dir)
    outputs = {name: root / name for name in old["files"] if name not in (LEDGER_JSON, LEDGER_TEXT, *CARD_FILES)}
    return write_release(run_dir, outputs, ledger=ledger, method=old["method"], timestamps=timestamps)


# Files that state the ledger's guarantee in words (the cards): a rebuild around another ledger drops them, and
# ``report.write_report`` writes them again from the new manifest, so a card never states a stale epsilon.
CARD_FILES = ("README.md", "MODEL_CARD.md")


def add_to_release(run_dir: str | Path, items: Mapping[str, str | Path]) -> Path:
    """Add (or replace) ``items`` (name in the release -> file or directory) in a written ``release/``, after
    checking its files against the old manifest; the manifest keeps every other key and lists the new hashes."""
    old = verify_files(run_dir)
    root = release_dir(run_dir)

    def build(staging: Path) -> None:
        shutil.copytree(root, staging, dirs_exist_ok=True)
        for name, src in items.items():
            src, dst = Path(src), staging / name
            if dst.is_dir():
                shutil.rmtree(dst)
            dst.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
        manifest = {**old, "files": {str(p.relative_to(staging)): _sha256(p) for p in _files(staging)
                                     if p.name != MANIFEST_FILE or p.parent != staging}}
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2), encoding="utf-8")

    return atomic_dir(root, build)


def read_manifest(run_dir: str | Path) -> dict:
    path = release_dir(run_dir) / MANIFEST_FILE
    if not path.is_file():
        raise ConfigError(f"{run_dir}: no release (expected {path}); a run writes it when its last stage finishes")
    return json.loads(path.read_text(encoding="utf-8"))


def verify_files(run_dir: str | Path) -> dict:
    """The manifest, after checking that ``release/`` holds exactly its files with their hashes. That it
    states what ``ledger.sqlite`` does is checked above the ledger: ``privacy.release_check``."""
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
