"""One tiny ACTG run on Ray (configs/actg_tiny.yaml), crashed after Best-of-N and resumed, shared by the files
that need a finished ACTG run: tests/test_actg_pipeline.py asserts on the crash and the resume, and
tests/test_report.py renders its report (on a copy). A tiny run costs about a minute of the suite's two cores;
one is enough for both (tests/conftest.py keeps the two files in one xdist group, so one worker builds it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "configs" / "actg_tiny.yaml"


@dataclass
class ResumedRun:
    """What the crash-and-resume left behind; the test asserts on it (the fixture asserts nothing)."""

    run: Path
    interrupted: bool = False  # the first call raised StageInterrupted after best_of_n
    done_after_crash: dict[str, str] = field(default_factory=dict)  # marker name -> text, before the resume
    synthetic_after_crash: bool = False
    charged_after_crash: list[tuple[str, str]] = field(default_factory=list)
    removed_markers: tuple[str, ...] = ("private", "dp_generator")
    resumed_run_dir: Path | None = None  # what main() returned on the resume


def tiny_config(tmp_path: Path, **update) -> Path:
    raw = yaml.safe_load(TINY.read_text())
    raw["run_dir"] = str(tmp_path / "run")
    raw.update(update)
    path = tmp_path / f"tiny_{len(update)}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def smaller_steps() -> dict:
    """configs/actg_tiny.yaml with one DP-SGD step and one RL step: every stage still runs (and is charged, crashed,
    closed and resumed) as the two files assert; what a second step would add is asserted nowhere here."""
    raw = yaml.safe_load(TINY.read_text())
    return {"generator": raw["generator"] | {"steps": 1}, "rl": raw["rl"] | {"steps": 1}}


def ledger_stages(run: Path) -> list[tuple[str, str]]:
    from dpsynth_core.privacy import PrivacyLedger

    return [(e.stage, e.kind) for e in PrivacyLedger.open(run).entries()]


def crash_and_resume(tmp_path: Path) -> ResumedRun:
    """1) "crash" once best_of_n has completed; 2) remove the markers of the DP-SGD stage and of the
    private stage (a crash between the ledger record and its markers); 3) resume."""
    from dpsynth_core.actg.pipeline import StageInterrupted
    from ray_jobs.actg import main

    state = ResumedRun(run=tmp_path / "run")
    smaller = smaller_steps()  # the same sizes on both calls: a changed config would be refused on the resume
    try:
        main(tiny_config(tmp_path, stop_after_stage="best_of_n", **smaller))
    except StageInterrupted:
        state.interrupted = True
    stages = state.run / "stages"
    state.done_after_crash = {p.name: p.read_text() for p in stages.glob("*.done")}
    state.synthetic_after_crash = (state.run / "synthetic.jsonl").exists()
    state.charged_after_crash = [s for s in ledger_stages(state.run) if s[1] != "post_processing"]
    for name in state.removed_markers:
        (stages / f"{name}.done").unlink()
    state.resumed_run_dir = Path(main(tiny_config(tmp_path, **smaller)))
    return state

