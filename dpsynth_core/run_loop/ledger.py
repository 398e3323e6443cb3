"""The run's ledger, created one way for every method: budget, the delta rule, reference runs.

* delta: an explicit one must be below 1/m; unset, min(1e-5, m^-1.1) (``privacy.default_delta``), m
  the declared (public) working-set size, never the drawn count (docs/privacy.md, "delta and m*delta");
* epsilon = inf (a reference run, the config says ``not_private: true``): a nominal finite budget,
  and the ledger is marked "not private" before any stage reads private data, so ``ledger show`` and
  the release manifest say so;
* an existing ledger is reopened (resume): its settings were fixed when it was created.
"""

from __future__ import annotations

from pathlib import Path

from dpsynth_core.privacy import LEDGER_FILE, PrivacyLedger, check_delta_for_size, default_delta
from dpsynth_core.privacy.reference_runs import mark_reference_run
from dpsynth_core.runs.contract import PrivacyPlan

REFERENCE_LEDGER_BUDGET = 1e6  # nominal: the ledger needs a finite budget; a reference run records no event


def resolve_delta(plan: PrivacyPlan) -> float:
    """The run's delta (see the module doc); checked before anything is written."""
    if plan.delta is None:
        return default_delta(plan.public_size)
    return check_delta_for_size(plan.delta, plan.public_size, plan.delta_field)


def open_run_ledger(root: Path, plan: PrivacyPlan, kind: str) -> PrivacyLedger:
    """Reopen ``root``'s ledger, or create it from ``plan`` (marking a reference run not private)."""
    if (Path(root) / LEDGER_FILE).is_file():
        return PrivacyLedger.open(root)
    Path(root).mkdir(parents=True, exist_ok=True)
    budget = REFERENCE_LEDGER_BUDGET if plan.is_reference else (plan.budget or plan.epsilon)
    ledger = PrivacyLedger.create(root, dataset=plan.dataset, epsilon_budget=budget, delta=resolve_delta(plan),
                                  public_size=plan.public_size)
    mark_reference_run(ledger, f"{kind}.reference", plan.epsilon)
    return ledger
