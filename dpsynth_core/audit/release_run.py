"""``run_release_audit``: run a method once on its private records + m canaries, attack ``release/`` only.

The audit package sits beside the methods (pyproject's layers) and imports none of them: the method
comes in as a ``ReleaseTarget`` (implemented above the library, ``dpsynth.api.audit``), which runs the
config's own stages through the run loop on the file this module hands it and says where the release is.

The steps (Steinke, Nasr & Jagielski's one-run audit):
1. m canaries disjoint from the private records, each included with probability 1/2 from OS entropy;
2. one run of the method on records + included canaries, in a secret order; the audit run's working set
   is that whole file, so every included canary reaches the mechanism (``reached``); its public size
   (records + m/2) is fixed before any canary is drawn, and it has its own ledger;
3. each canary scored from the released files alone; the ``guesses_in`` top scores guessed "in", the
   ``guesses_out`` bottom ones "out"; the one-run bound (``audit.bound``) at the configured confidence;
4. the audit run's directory is deleted: its outputs are the owner's experiment, never a release.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dpsynth_core.audit.bound import audit_status, epsilon_lower_bound, largest_reachable_bound
from dpsynth_core.audit.release_canaries import CanaryDesign
from dpsynth_core.audit.release_settings import ReleaseAuditSettings
from dpsynth_core.audit.run import count_correct  # the same guess rule as `audit dpsgd`
from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy.randomness import secure_rng


@dataclass(frozen=True)
class AuditRunOutcome:
    """What the audit run left: where its release is, and its own ledger's statement."""

    release_dir: Path
    delta: float
    ledger_epsilon: float  # math.inf when the ledger is marked not private (a test-only mode)
    ledger_private: bool


class ReleaseTarget(ABC):
    """One method's config as the audit drives it: its private records, canary design and one run."""

    method: str  # as `dpsynth run <method>` names it

    @property
    @abstractmethod
    def claimed_epsilon(self) -> float:
        """The epsilon the config claims for its release."""

    @abstractmethod
    def design(self, settings: ReleaseAuditSettings) -> CanaryDesign:
        """How this method's canaries are drawn and scored."""

    @abstractmethod
    def private_records(self) -> Any:
        """The records the config's run would take as its working set."""

    @abstractmethod
    def run(self, records: Any, public_size: int, root: Path, mode: str) -> AuditRunOutcome:
        """Run the config's stages on ``records`` (the whole file is the working set) in ``root``."""

    @abstractmethod
    def released_records(self, release_dir: Path) -> Any:
        """The released records the attack reads (the synthetic table or texts)."""

    def audited_run_dir(self) -> Path | None:
        """The run directory of this very config, when it holds a run (its report then shows the audit)."""
        return None


@dataclass
class ReleaseAuditResult:
    """What the audit found (public numbers and counts only); ``to_summary()`` is ``release_audit.json``."""

    method: str
    mode: str
    canaries: int
    included: int
    reached: int  # included canaries in the mechanism's working set (all of them: whole-file working set)
    guesses: int
    correct: int
    epsilon_lower_bound: float
    claimed_epsilon: float
    largest_reachable_bound: float
    delta: float
    confidence: float
    ledger_epsilon: float
    ledger_private: bool
    wall_seconds: float

    @property
    def status(self) -> str:
        return audit_status(self.epsilon_lower_bound, self.claimed_epsilon, self.largest_reachable_bound)

    def to_summary(self) -> dict:
        out = {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in asdict(self).items()}
        out.update(kind="release", status=self.status, false_alarm_rate=round(1.0 - self.confidence, 6),
                   reading=(f"a lower bound at {self.confidence:.0%} from this attack on the released files: "
                            f"failed = the claimed epsilon is refuted (a pipeline that meets its claim is reported "
                            f"failed with probability at most {1 - self.confidence:.0%}); passed = not refuted, which "
                            f"is no proof of privacy; inconclusive = the claim is at or above the largest bound "
                            f"this m and these guesses can reach ({self.largest_reachable_bound:.3f})"))
        if not self.ledger_private:
            out["warning"] = f"NOT PRIVATE: test-only mode '{self.mode}'; the claimed epsilon does not hold"
        return out


def run_release_audit(target: ReleaseTarget, settings: ReleaseAuditSettings, work_dir: Path, *,
                      allow_test_only: bool = False) -> ReleaseAuditResult:
    """One audit run of ``target`` in ``work_dir`` (deleted afterwards); see the module doc."""
    if settings.test_only and not allow_test_only:
        raise ConfigError(f"field 'audit.mode': '{settings.mode}' is a test-only mode (the run is not private); "
                          "it needs --allow-test-only")
    started = time.monotonic()
    design = target.design(settings)
    records = target.private_records()
    public_size = len(records) + settings.canaries // 2  # public: fixed before any canary is drawn
    rng = secure_rng()
    canaries = design.draw(settings.canaries, records, rng)
    included = rng.random(settings.canaries) < 0.5
    members = canaries[included] if design.kind == "table" else [c for c, keep in zip(canaries, included) if keep]
    audit_file = design.combine(records, members, rng)
    work_dir = Path(work_dir)
    if work_dir.exists():
        raise ConfigError(f"{work_dir}: the audit's run directory already exists; remove it or pick another")
    try:
        outcome = target.run(audit_file, public_size, work_dir, settings.mode)
        scores = design.score(canaries, target.released_records(outcome.release_dir))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)  # the audit's outputs are never released
    guesses = settings.k_in + settings.k_out
    correct = count_correct(scores, included, settings.k_in, settings.k_out)
    return ReleaseAuditResult(
        method=target.method, mode=settings.mode, canaries=settings.canaries, included=int(included.sum()),
        reached=int(included.sum()), guesses=guesses, correct=correct,
        epsilon_lower_bound=epsilon_lower_bound(settings.canaries, guesses, correct, outcome.delta, settings.confidence),
        claimed_epsilon=target.claimed_epsilon,
        largest_reachable_bound=largest_reachable_bound(settings.canaries, guesses, outcome.delta, settings.confidence),
        delta=outcome.delta, confidence=settings.confidence, ledger_epsilon=outcome.ledger_epsilon,
        ledger_private=outcome.ledger_private, wall_seconds=round(time.monotonic() - started, 1))


def write_release_audit(result: ReleaseAuditResult, path: Path) -> Path:
    """``release_audit.json`` at ``path`` (public numbers only: counts, bounds, the claim)."""
    from dpsynth_core.runs.files import atomic_write_text

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(result.to_summary(), indent=1))
    return path
