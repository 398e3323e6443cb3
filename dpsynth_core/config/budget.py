"""The one base of every run config whose budget sits under ``privacy:`` (PE, DPFairLLM, AIM, train).

``privacy.epsilon`` / ``privacy.delta`` are the keys; the old places (top-level ``epsilon`` / ``delta``)
load for one release, moved before validation and named by one line (``config/keys.py``). A subclass
extends ``moved_keys`` with the keys it moved itself (old dotted key -> new dotted key).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import model_validator

from dpsynth_core.config.keys import move_keys
from dpsynth_core.config.strict import StrictConfig


class BudgetConfig(StrictConfig):
    """A run config with a ``privacy`` section holding ``epsilon`` and ``delta``."""

    moved_keys: ClassVar[dict[str, str]] = {"epsilon": "privacy.epsilon", "delta": "privacy.delta"}

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, values):
        return move_keys(values, cls.moved_keys)

    @property
    def epsilon(self) -> float:
        return self.privacy.epsilon  # type: ignore[attr-defined]

    @property
    def delta(self):
        return self.privacy.delta  # type: ignore[attr-defined]
