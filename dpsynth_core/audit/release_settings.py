"""Settings of a release audit (the ``audit:`` section of a ``dpsynth audit release`` config)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from dpsynth_core.config import StrictConfig

# The test-only modes: the audit must be able to fail, so these break the pipeline on purpose.
# dp_off: every DP mechanism of the method runs without noise; broken_release: a stage copies
# LEAK_FRACTION of the private working set into the released output. Both are refused without the
# caller's explicit test-only flag and mark the audit run's ledger "not private" (epsilon = inf).
TEST_ONLY_MODES = ("dp_off", "broken_release")
LEAK_FRACTION = 0.10


class ReleaseAuditSettings(StrictConfig):
    """m canaries, the guesses, the confidence of the bound, and the mode.

    The auditor guesses "in" for the ``guesses_in`` canaries that score highest against the release
    and "out" for the ``guesses_out`` lowest. Both are fixed before the run (a choice made after seeing
    the scores would need a multiple-testing correction). The default guesses only "in", on m / 25
    canaries: what a release leaks, it leaks for few records (a copied row, a reproduced rare cell),
    so precision on few guesses refutes more than accuracy on many.
    """

    # m = 1,000 with 40 "in" guesses can refute up to 2.5 at delta = 1e-5; m = 200 with 8 only up to 0.78
    canaries: int = Field(1000, ge=4)
    guesses_in: int | None = Field(None, ge=1)
    guesses_out: int = Field(0, ge=0)
    confidence: float = Field(0.95, gt=0, lt=1)
    canary_words: int = Field(6, ge=2, le=32)  # text canaries: random pseudo-words per secret
    mode: Literal["dp", "dp_off", "broken_release"] = "dp"

    @model_validator(mode="after")
    def _guesses_fit(self) -> ReleaseAuditSettings:
        if self.k_in + self.k_out > self.canaries:
            raise ValueError(f"guesses_in + guesses_out = {self.k_in + self.k_out} exceeds the number of canaries "
                             f"({self.canaries})")
        return self

    @property
    def k_in(self) -> int:
        return self.guesses_in if self.guesses_in is not None else max(1, self.canaries // 25)

    @property
    def k_out(self) -> int:
        return self.guesses_out

    @property
    def test_only(self) -> bool:
        return self.mode in TEST_ONLY_MODES
