"""The one loop around every method's stages (``runs.contract``): pre-flight, lock, rerun rule, resume,
markers, the ledger (budget, delta rule, reference runs), release, report hook and summary line.

It opens the privacy ledger, so it sits above ``privacy`` and below the methods (pyproject's layers).
"""

from dpsynth_core.run_loop.ledger import REFERENCE_LEDGER_BUDGET, open_run_ledger, resolve_delta
from dpsynth_core.run_loop.loop import ReportHook, RunResult, run_method

__all__ = ["REFERENCE_LEDGER_BUDGET", "ReportHook", "RunResult", "open_run_ledger", "resolve_delta", "run_method"]
