"""Hooks called by the runner after every iteration: metrics, checkpoints, progress."""

from __future__ import annotations

import json
from pathlib import Path

from dpsynth_core.pe.checkpoint import RunState, save_checkpoint


class Callback:
    """Override what you need; every hook receives the current :class:`RunState`."""

    def on_iteration_end(self, state: RunState) -> None:  # noqa: B027
        pass

    def on_run_end(self, state: RunState) -> None:  # noqa: B027
        pass


class CheckpointCallback(Callback):
    """Checkpoint at every iteration (atomic)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)

    def on_iteration_end(self, state: RunState) -> None:
        save_checkpoint(self.run_dir, state)


class MetricsLogger(Callback):
    """Appends the iteration's metrics row (numbers only, never texts) to ``metrics.jsonl``."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"

    def on_iteration_end(self, state: RunState) -> None:
        if not state.history:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(state.history[-1]) + "\n")


class StopAfter(Callback):
    """Raises :class:`InterruptedRun` once ``iteration`` is checkpointed (to test resume)."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def on_iteration_end(self, state: RunState) -> None:
        if state.iteration >= self.iteration:
            raise InterruptedRun(f"stopped after iteration {state.iteration}")


class InterruptedRun(RuntimeError):
    """Raised by :class:`StopAfter`."""
