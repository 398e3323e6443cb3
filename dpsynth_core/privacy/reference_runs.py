"""Non-private reference runs (epsilon = inf): the paper tables' "no noise" row, never by accident.

Every pipeline takes the same two config keys: ``epsilon: .inf`` (YAML's infinity) is refused
unless the config also says ``not_private: true``; a run that is allowed marks its ledger "not
private" before any stage reads private data, so ``ledger show``, ``metrics.json`` and
``release/MANIFEST.json`` all carry the mark. A reference run's noisy stages run without noise
and record no event (there is no finite epsilon to record); its ledger keeps a nominal finite
budget only because the ledger requires one. A run config with a ``privacy:`` section inherits
:class:`ReferenceRunConfig` (PE, DPFairLLM, AIM; ACTG calls :func:`check_reference_config` itself), and the
run loop calls :func:`mark_reference_run` when the run's ledger is created.
"""

from __future__ import annotations

import math

from pydantic import model_validator

from dpsynth_core.config.budget import BudgetConfig
from dpsynth_core.errors import ConfigError

REFERENCE_REASON = "epsilon = inf: no DP noise (a non-private reference run, config not_private: true)"


def is_infinite(epsilon: float | None) -> bool:
    return epsilon is not None and math.isinf(float(epsilon)) and float(epsilon) > 0


def check_reference_config(epsilon: float | None, not_private: bool, field: str = "privacy.epsilon") -> None:
    """Refuse epsilon = inf without ``not_private: true``, and ``not_private: true`` with a finite epsilon."""
    if is_infinite(epsilon) and not not_private:
        raise ConfigError(
            f"{field}: epsilon = inf turns DP noise off; a non-private reference run needs "
            "`not_private: true` in the config (its outputs are then marked NOT PRIVATE)")
    if not_private and not is_infinite(epsilon):
        raise ConfigError(
            f"not_private: true is only for reference runs with {field} = .inf (got a finite epsilon); "
            "remove it for a private run")


def mark_reference_run(ledger, stage: str, epsilon: float | None) -> bool:
    """Mark the ledger "not private" when epsilon is infinite; returns whether it did."""
    if not is_infinite(epsilon):
        return False
    ledger.mark_not_private(stage, REFERENCE_REASON)
    return True


class ReferenceRunConfig(BudgetConfig):
    """A run config that may be an epsilon = inf reference run: ``not_private`` and the check above."""

    not_private: bool = False  # required for privacy.epsilon = .inf; the run's outputs are then marked

    @model_validator(mode="after")
    def _reference_run(self):
        try:
            check_reference_config(self.epsilon, self.not_private, "privacy.epsilon")
        except ConfigError as exc:  # a validation error like every other field's
            raise ValueError(str(exc)) from None
        return self

    @property
    def is_reference(self) -> bool:
        """epsilon = inf with not_private: true: no DP noise; the ledger is marked."""
        return is_infinite(self.epsilon)
