"""A Ray-free search space: finite choices and bounded intervals, secret draws, covering grids.

``ray_jobs/sweep.py`` converts a Ray Tune param space into this form (anything it cannot
express -- ``sample_from``, unbounded functions -- is refused for a private sweep), so that the
library can (1) bound the privacy cost over the *whole* space before a trial runs and (2) draw
the trials' hyperparameters from OS entropy.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from dpsynth_core.privacy.randomness import secure_rng


@dataclass(frozen=True)
class Choice:
    """A uniform draw from finitely many values."""

    values: tuple[Any, ...]

    def draw(self, rng: np.random.Generator) -> Any:
        return self.values[int(rng.integers(len(self.values)))]

    def fixed(self) -> Any:
        return self.values[0]


@dataclass(frozen=True)
class Interval:
    """A draw from [low, high] (log-uniform when ``log``)."""

    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low <= self.high):
            raise ValueError(f"interval [{self.low}, {self.high}] is not bounded")
        if self.log and self.low <= 0:
            raise ValueError(f"log interval [{self.low}, {self.high}] needs low > 0")

    def draw(self, rng: np.random.Generator) -> float:
        if self.log:
            return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        return float(rng.uniform(self.low, self.high))

    def fixed(self) -> float:
        return float(self.low)

    def grid(self, cells: int) -> list[float]:
        """``cells + 1`` points from low to high (log-spaced when ``log``), ends included."""
        if self.log:
            points = np.geomspace(self.low, self.high, cells + 1)
        else:
            points = np.linspace(self.low, self.high, cells + 1)
        points[0], points[-1] = self.low, self.high  # the ends exactly, not a rounding inside
        return [float(p) for p in points]


Param = Union[Choice, Interval]
SearchSpace = dict[str, Param]


def draw_configurations(space: SearchSpace, count: int, rng: np.random.Generator | None = None) -> list[dict]:
    """``count`` independent draws from ``space``, from OS entropy unless a generator is given
    (tests only). In a DP sweep the trials are i.i.d. draws independent of the data and of any
    config seed, as Papernot & Steinke's mixture argument assumes."""
    rng = rng if rng is not None else secure_rng()
    return [{key: param.draw(rng) for key, param in space.items()} for _ in range(count)]


def grid_cells(space: SearchSpace, cells_per_interval: int) -> list[list[dict]]:
    """Cover ``space`` by cells: every combination of choice values x every grid cell of every
    interval. Each cell is returned as the list of its corner configurations (2^d corners for d
    intervals). A quantity that is monotone in each interval parameter takes its maximum over a
    cell at one of the corners, so the max over all corners of all cells bounds it on the space."""
    choice_keys = [k for k, p in space.items() if isinstance(p, Choice)]
    interval_keys = [k for k, p in space.items() if isinstance(p, Interval)]
    grids = {k: space[k].grid(cells_per_interval) for k in interval_keys}
    out: list[list[dict]] = []
    for values in itertools.product(*(space[k].values for k in choice_keys)):
        base = dict(zip(choice_keys, values))
        for cell in itertools.product(*(range(len(grids[k]) - 1) for k in interval_keys)):
            corners = []
            for ends in itertools.product((0, 1), repeat=len(interval_keys)):
                corner = dict(base)
                corner.update({k: grids[k][i + e] for k, i, e in zip(interval_keys, cell, ends)})
                corners.append(corner)
            out.append(corners)
    return out
