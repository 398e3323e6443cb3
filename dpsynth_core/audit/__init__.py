"""Empirical privacy audit of the DP-SGD generator: one training run with canaries (no Ray here)."""

import importlib

# Lazy exports (PEP 562): the audit run imports torch; the CLI should not pay for it at start-up.
_EXPORTS = {
    "bound_by_guesses": "bound", "epsilon_lower_bound": "bound", "one_run_p_value": "bound",
    "largest_reachable_bound": "bound", "audit_status": "bound",
    "AuditSettings": "config", "AuditResult": "run", "run_dpsgd_audit": "run", "write_audit_report": "run",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
