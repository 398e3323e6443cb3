"""Empirical privacy audit of the DP-SGD generator: one training run with canaries (no Ray here)."""

from dpsynth_core.audit.bound import bound_by_guesses, epsilon_lower_bound, one_run_p_value
from dpsynth_core.audit.config import AuditSettings
from dpsynth_core.audit.run import AuditResult, run_dpsgd_audit, write_audit_report

__all__ = [
    "AuditResult",
    "AuditSettings",
    "bound_by_guesses",
    "epsilon_lower_bound",
    "one_run_p_value",
    "run_dpsgd_audit",
    "write_audit_report",
]
