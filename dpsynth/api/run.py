"""What ``Job.run()`` returns: a finished run, its ledger and its release."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dpsynth_core.run_loop import RunResult


@dataclass(frozen=True)
class LedgerView:
    """The run's ledger as ``dpsynth ledger show`` states it: the composed epsilon at delta, the budget."""

    epsilon: float  # composed over every recorded event (PLD / RDP), never a sum
    delta: float
    budget: float
    is_private: bool  # False for a reference run (epsilon = inf) or a test-only knob
    public_size: int | None  # m, the declared working-set size
    stages: tuple[tuple[str, str, float], ...]  # (stage, event kind, epsilon of the event alone)

    @classmethod
    def open(cls, ledger_dir: Path) -> LedgerView:
        from dpsynth_core.privacy import PrivacyLedger

        ledger = PrivacyLedger.open(ledger_dir)
        return cls(ledger.total_epsilon(), ledger.delta, ledger.epsilon_budget, ledger.is_private, ledger.public_size,
                   tuple((e.stage, e.kind, e.epsilon) for e in ledger.entries()))


@dataclass(frozen=True)
class Run:
    """A finished run directory: the run loop's ``RunResult``, with the ledger as ``dpsynth ledger show`` states
    it. ``release_dir`` holds what may be published (verify it with :meth:`verify`)."""

    result: RunResult

    @property
    def run_dir(self) -> Path:
        return self.result.run_dir

    @property
    def ledger_dir(self) -> Path:
        return self.result.ledger_dir

    @property
    def started(self) -> float:
        return self.result.started

    @property
    def ledger(self) -> LedgerView:
        return LedgerView.open(self.ledger_dir)

    @property
    def release_dir(self) -> Path:
        return self.result.release_dir

    def verify(self) -> dict:
        """The release manifest, after checking every file's hash and that it states what the ledger does."""
        from dpsynth_core.privacy.release_check import verify_release

        return verify_release(self.ledger_dir)

    def summary_lines(self) -> list[str]:
        """Where the outputs are, the epsilon spent of the budget, the stages run now and skipped."""
        return self.result.summary_lines()
