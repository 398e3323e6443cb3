"""Settings of a one-run DP-SGD audit (the ``audit:`` section of an audit config)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from dpsynth_core.config import StrictConfig


class AuditSettings(StrictConfig):
    """m canaries, the guesses made from their scores, and the confidence of the bound.

    The auditor guesses "in" for the ``guesses_in`` canaries whose loss fell most during training
    and "out" for the ``guesses_out`` whose loss fell least, and abstains on the rest. Both are
    fixed before training (default: a quarter of m each): choosing them after seeing the scores
    would need a multiple-testing correction.
    """

    # m = 1,000 (250 + 250 guesses) can refute up to 5.09 at delta = 1e-5; m = 100 only up to 2.78
    canaries: int = Field(1000, ge=4)
    canary_tokens: int = Field(8, ge=1)
    guesses_in: int | None = Field(None, ge=1)
    guesses_out: int | None = Field(None, ge=0)
    confidence: float = Field(0.95, gt=0, lt=1)
    # "off" (sigma = 0) shows that the audit can fail; refused unless the caller passes the
    # explicit test-only flag, and the report then says the run is not private.
    noise: Literal["calibrated", "off"] = "calibrated"

    @model_validator(mode="after")
    def _guesses_fit(self) -> AuditSettings:
        if self.k_in + self.k_out > self.canaries:
            raise ValueError(
                f"guesses_in + guesses_out = {self.k_in + self.k_out} exceeds the number of canaries ({self.canaries})"
            )
        return self

    @property
    def k_in(self) -> int:
        return self.guesses_in if self.guesses_in is not None else max(1, self.canaries // 4)

    @property
    def k_out(self) -> int:
        return self.guesses_out if self.guesses_out is not None else max(1, self.canaries // 4)
