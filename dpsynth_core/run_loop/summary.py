"""The short summary printed at the end of every ``dpsynth run``: where the outputs are, how much of
the privacy budget is spent, and which stages ran now, which were already done (skipped) and so
whether the run was resumed.

Completed units are what the pipelines leave behind: ``stages/<name>.done`` (ACTG, DPFairLLM, AIM)
and ``checkpoints/iter_XXXX.json`` (WASP, Aug-PE; iteration 0 is the initial population). A unit
written since this invocation started ran now; an older one was skipped. Everything printed is a
public quantity (stage names, the composed epsilon the release reports anyway). It reads the run's
ledger, so it sits with the run loop, above the library's ``runs`` package (which stays below ``privacy``).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path


def completed_units(run_dir: Path) -> dict[str, float]:
    """Name of each completed stage/iteration -> when it completed (file mtime)."""
    run_dir = Path(run_dir)
    units: dict[str, float] = {}
    for marker in sorted((run_dir / "stages").glob("*.done")):
        units[marker.stem] = marker.stat().st_mtime
    for ckpt in sorted((run_dir / "checkpoints").glob("iter_*.json")):
        units[f"iteration {int(ckpt.stem.removeprefix('iter_'))}"] = ckpt.stat().st_mtime
    return units


def _privacy_line(run_dir: Path, since: float) -> str | None:
    from dpsynth_core.errors import DpsynthError
    from dpsynth_core.privacy import PrivacyLedger
    from dpsynth_core.privacy.composition import compose_with_details

    try:
        ledger = PrivacyLedger.open(run_dir)
        entries = ledger.entries()
    except DpsynthError:
        return None
    total = ledger.total_epsilon()
    earlier = [e.event() for e in entries if datetime.fromisoformat(e.timestamp).timestamp() < since]
    before = compose_with_details(earlier, ledger.delta)[0] if earlier else 0.0
    flag = "NOT PRIVATE (see `dpsynth ledger show`); " if not ledger.is_private else ""
    return (f"privacy: {flag}epsilon {total:.3f} of budget {ledger.epsilon_budget:g} spent at delta "
            f"{ledger.delta:.3g} ({max(0.0, total - before):.3f} by this invocation)")


def summary_lines(run_dir: Path, started: float) -> list[str]:
    """The summary of a run that this invocation (started at ``started``, epoch seconds) ran."""
    run_dir = Path(run_dir).resolve()
    units = completed_units(run_dir)
    ran = [n for n, t in units.items() if t >= started - 1.0]  # mtimes may round down to the second
    skipped = [n for n in units if n not in ran]
    lines = [f"run directory: {run_dir}"]
    privacy = _privacy_line(run_dir, started - 1.0)
    if privacy:
        lines.append(privacy)
    if skipped and not ran:
        lines.append(f"stages: all {len(skipped)} already done, none run (--fresh starts over)")
    elif skipped:
        lines.append(f"stages: resumed; run now: {', '.join(ran)}; skipped (already done): {', '.join(skipped)}")
    else:
        lines.append(f"stages run: {', '.join(ran) or 'none'}")
    return lines


def now() -> float:
    return time.time()
