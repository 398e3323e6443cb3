"""A run left where an older release put it: refused, never started again in the new place.

Before one run-location rule (the run directory is ``output_dir``; ``name`` only labels the run),
DPFairLLM and AIM ran in ``output_dir/name``. The same config rerun under the new rule would find an
empty run directory, create a fresh ledger and spend its budget again on the same data. So when the
run directory holds no run but the former one (a method's ``former_run_dir``) does, the run is
refused in one line naming both paths and the key that continues the old run; nothing is written.
"""

from __future__ import annotations

from pathlib import Path

from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy import LEDGER_FILE
from dpsynth_core.runs import CONFIG_FILE


def holds_run(root: Path) -> bool:
    """True when ``root`` holds (part of) a run: its config snapshot, its ledger or a stage marker."""
    root = Path(root)
    return ((root / CONFIG_FILE).is_file() or (root / LEDGER_FILE).is_file()
            or any((root / "stages").glob("*.done")))


def refuse_former_run(root: Path, former: Path | None, key: str = "output_dir") -> None:
    """ConfigError when ``root`` holds no run and ``former`` holds one (see the module doc); reads only."""
    if former is None or Path(former) == Path(root) or holds_run(root) or not holds_run(former):
        return
    raise ConfigError(f"{former} holds this config's run, made when the run directory was output_dir/name; it now "
                      f"is output_dir ({root}), which holds no run, and a new run there would spend the budget "
                      f"again on the same data: set {key}: {former} to continue that run")
