"""Checkpoint after every iteration and resume from the latest one. Atomic: write to a temp file
in the same folder, then rename. A checkpoint holds synthetic data and DP outputs only."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dpsynth_core.errors import DataError
from dpsynth_core.pe.population import Population
from dpsynth_core.runs.files import atomic_write_text


@dataclass
class RunState:
    """Everything needed to continue a run after iteration ``iteration`` (0 = initial samples)."""

    method: str
    iteration: int
    population: Population
    plm_weights: list[float]
    history: list[dict] = field(default_factory=list)  # per-iteration metrics (no texts)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["population"] = self.population.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RunState:
        return cls(d["method"], int(d["iteration"]), Population.from_dict(d["population"]),
                   list(d["plm_weights"]), list(d.get("history", [])))


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: Path, state: RunState) -> Path:
    """Write ``checkpoints/iter_XXXX.json`` and point ``checkpoints/latest`` at it."""
    folder = checkpoint_dir(run_dir)
    path = folder / f"iter_{state.iteration:04d}.json"
    atomic_write_text(path, json.dumps(state.to_dict(), ensure_ascii=False))
    atomic_write_text(folder / "latest", path.name + "\n")
    return path


def load_latest_checkpoint(run_dir: Path) -> RunState | None:
    """The latest complete checkpoint, or None for a fresh run."""
    pointer = checkpoint_dir(run_dir) / "latest"
    if not pointer.is_file():
        return None
    path = checkpoint_dir(run_dir) / pointer.read_text(encoding="utf-8").strip()
    try:
        return RunState.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        raise DataError(f"{path}: unreadable checkpoint ({type(exc).__name__}); start with --fresh") from None


class VoteStore:
    """Keeps each iteration's *noisy* vote vector (a DP release) as soon as it is drawn.

    A run interrupted after a vote but before that iteration's checkpoint would otherwise draw a
    second noisy histogram of the same private data on resume: one release more than the ledger
    accounts. Resuming re-uses the stored release instead (post-processing, no extra cost).
    Only noisy values are stored, never raw counts or private records.
    """

    def __init__(self, run_dir: Path) -> None:
        self.folder = Path(run_dir) / "votes"

    def _path(self, iteration: int) -> Path:
        return self.folder / f"iter_{iteration:04d}.json"

    def load(self, iteration: int, size: int) -> list[float] | None:
        path = self._path(iteration)
        if not path.is_file():
            return None
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise DataError(f"{path}: unreadable stored vote ({type(exc).__name__})") from None
        if int(saved["size"]) != size:
            raise DataError(f"{path}: stored vote has {saved['size']} entries, the population needs {size}; "
                            "the run directory is inconsistent (start with --fresh)")
        return [float(v) for v in saved["noisy"]]

    def save(self, iteration: int, noisy: list[float], size: int) -> None:
        atomic_write_text(self._path(iteration), json.dumps({"size": int(size), "noisy": list(map(float, noisy))}))
        from dpsynth_core.runs.storage_sync import make_durable  # object-store runs: in the bucket before it is used

        make_durable(self.folder.parent, self._path(iteration))
