"""Poisson sampling that matches the accountant, rank-consistent across workers.

Every logical step draws the GLOBAL Poisson batch from an RNG keyed by (seed, step); every rank
draws the same batch and keeps its shard ``batch[rank::world]``. So every rank takes every step
(an empty local shard still joins the all-reduce), and resuming at step t needs no RNG state
beyond (seed, t). Opacus's DistributedUniformWithReplacementSampler, by contrast, skips empty
local batches, so ranks can disagree on the step count and hang.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpsynth_core.errors import ConfigError


@dataclass(frozen=True)
class PrivacyUnits:
    """The privacy unit index: unit u owns ``members[u]`` (example indices).

    Record-level DP: one unit per example. User-level DP: one unit per user id.
    """

    members: list[list[int]]
    user_level: bool

    @classmethod
    def from_user_ids(cls, user_ids: Sequence[str | None]) -> PrivacyUnits:
        if not any(u is not None for u in user_ids):
            return cls([[i] for i in range(len(user_ids))], user_level=False)
        missing = [i for i, u in enumerate(user_ids) if u is None]
        if missing:
            raise ConfigError(
                f"user-level DP: {len(missing)} training examples have no user_id (first at row {missing[0]}); "
                "give every example a user_id or none"
            )
        groups: dict[str, list[int]] = {}
        for i, u in enumerate(user_ids):
            groups.setdefault(str(u), []).append(i)
        return cls(list(groups.values()), user_level=True)

    def __len__(self) -> int:
        return len(self.members)


class PoissonSampler:
    """Each unit joins the logical batch of a step independently with probability q = expected/n."""

    def __init__(self, n_units: int, expected_batch_size: int, seed: int, sampling_rate: float | None = None):
        """``sampling_rate`` overrides expected/n (a public rate for a secret subsample of unknown size)."""
        if n_units <= 0:
            raise ConfigError("no training units to sample from")
        if sampling_rate is None and expected_batch_size > n_units:
            raise ConfigError(
                f"expected_batch_size={expected_batch_size} exceeds the number of privacy units ({n_units})"
            )
        self.n_units = n_units
        self.expected_batch_size = expected_batch_size
        self.sampling_rate = float(sampling_rate) if sampling_rate is not None else expected_batch_size / n_units
        self.seed = int(seed)

    def rng(self, step: int, stream: int = 0) -> np.random.Generator:
        """The RNG of one step (stream 0: membership; 1: example choice within users)."""
        return np.random.default_rng([self.seed, int(step), int(stream)])

    def sample(self, step: int) -> np.ndarray:
        """Sorted unit indices of the global logical batch of ``step`` (may be empty)."""
        mask = self.rng(step).random(self.n_units) < self.sampling_rate
        return np.flatnonzero(mask)

    def local_units(self, step: int, rank: int, world_size: int) -> np.ndarray:
        """This rank's shard of the global batch; possibly empty, but the step still happens."""
        return self.sample(step)[rank::world_size]

    def state_dict(self) -> dict:
        return {"seed": self.seed, "n_units": self.n_units, "expected_batch_size": self.expected_batch_size}


def select_examples(
    units: np.ndarray, privacy_units: PrivacyUnits, max_per_unit: int, rng: np.random.Generator
) -> list[list[int]]:
    """For each sampled unit, at most ``max_per_unit`` of its examples (chosen at random)."""
    chosen = []
    for u in units:
        members = privacy_units.members[int(u)]
        if len(members) > max_per_unit:
            members = sorted(rng.choice(members, size=max_per_unit, replace=False).tolist())
        chosen.append(list(members))
    return chosen


def physical_chunks(groups: list[list[int]], physical_batch_size: int) -> list[list[list[int]]]:
    """Split a local logical batch (groups of example indices, one per unit) into physical batches."""
    return [groups[i : i + physical_batch_size] for i in range(0, len(groups), physical_batch_size)]
