"""What a pre-flight reports: the plan of a run, as far as it is known before it starts.

Each method has its own pre-flight, living with it (``actg.preflight``, ``pe.preflight``,
``tabular.preflight``, ``dpsgd.train_job``): it loads the config strictly (errors name the full field
path; an empty file is an error; caps on every size knob), reads and validates the WHOLE private
file (errors name file, column and 1-based row, never a value), and resolves delta against the
public expected size, so a bad file or config fails in seconds and leaves nothing on disk.
`dpsynth run <pipeline>` and `dpsynth train` call it first; `--check` prints the plan.

The plan's ``rows`` (rows in the private file) is a private statistic: it is printed only to
the data owner's terminal by ``--check`` (as ``dpsynth data check`` does) and never logged or stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Plan:
    """What a run would do, as far as it is known before it starts."""

    pipeline: str
    config: Path
    stages: list[str]
    epsilon: float | None  # None: no privacy cost (post-processing of a DP model)
    delta: float | None
    data: str
    rows: int
    output_dir: Path
    notes: tuple[str, ...] = ()  # lines a user can act on (e.g. a weaker default chosen for want of a file)

    def render(self) -> str:
        return "\n".join([
            f"pre-flight OK: {self.pipeline} ({self.config})",
            *self.notes,
            f"stages:     {' -> '.join(self.stages)}",
            f"privacy:    epsilon {self.epsilon:g} at delta {self.delta:.3g}" if self.epsilon is not None
            else "privacy:    none spent (post-processing of a DP model)",
            f"data:       {self.data}: {self.rows} rows, valid" + (" (owner-only figure)" if self.epsilon is not None else ""),
            f"output dir: {self.output_dir.resolve()}",
            "nothing was written (--check)",
        ])
