"""The privacy cost of a DP sweep, bounded over the whole search space before any trial runs.

A trial's privacy events are a function of its configuration (and of the number of private
units, which DP accounting treats as public), never of the data. A pipeline's *planner* computes
them without reading data, with the same calibration code the pipeline runs (AIM's rho, DP-SGD's
noise fitted to the ledger). The bound then covers the declared space, not the configurations
that happen to be drawn:

* keys that cannot change a trial's events (RL schedule, learning rate, decoding) are declared
  ``privacy_free`` per planner and fixed for planning;
* every other finite choice is enumerated;
* every other interval must be declared ``monotone`` (each event's cost is monotone in it): the
  interval is cut into cells, and on each cell every event slot takes the corner whose RDP curve
  dominates the other corners' at every order (Gaussian-family events with one free noise
  parameter are ordered that way). Intervals that are neither are refused: we cannot bound them.

The candidates (one event tuple per cell) form a ``SelectionEvent``; by joint quasi-convexity of
Renyi divergence any trial drawn from the space is within the pointwise max of their curves.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Protocol

import numpy as np

from dpsynth_core.errors import ConfigError
from dpsynth_core.tuning.space import Choice, Interval, SearchSpace, grid_cells

MAX_PLANNED_POINTS = 400  # each point calibrates DP-SGD noise (~0.1-1 s); a space wider than this is refused


@dataclass(frozen=True)
class TrialPlan:
    """What one trial would spend: its private events, at its ledger's delta, on ``dataset``."""

    events: tuple
    delta: float
    dataset: str


class Planner(Protocol):
    """A method's planner (ACTG's: ``actg.sweep_planner``); the sweep's driver picks one per pipeline."""

    privacy_free: tuple[str, ...]
    monotone: tuple[str, ...]

    def plan(self, config: dict) -> TrialPlan: ...


@dataclass(frozen=True)
class SweepBound:
    """The whole-space bound: the selection event, its epsilon at ``delta``, and the trial plans' dataset."""

    event: object  # SelectionEvent
    epsilon: float
    delta: float
    dataset: str
    planned_points: int

    def per_trial_curve(self, orders) -> np.ndarray:
        """The RDP curve that bounds any one trial of the space (max over the candidates)."""
        from dpsynth_core.privacy.events import rdp_curve

        return np.max(np.stack([rdp_curve(c, orders) for c in self.event.candidates]), axis=0)

    def covers(self, events) -> bool:
        """Whether a trial that actually ran spent within the per-trial curve (at every order)."""
        from dpsynth_core.privacy.events import rdp_curve, rdp_orders

        orders = rdp_orders()
        private = [e for e in events if e.kind != "post_processing"]
        bound = self.per_trial_curve(orders)
        return bool(np.all(rdp_curve(private, orders) <= bound * (1 + 1e-6) + 1e-12))


def _relevant_space(planner: Planner, space: SearchSpace) -> SearchSpace:
    relevant = {k: p for k, p in space.items() if not any(fnmatchcase(k, pat) for pat in planner.privacy_free)}
    for key, param in relevant.items():
        if isinstance(param, Interval) and key not in planner.monotone:
            raise ConfigError(
                f"refusing a DP sweep: '{key}' is a continuous range that changes the trials' privacy cost "
                f"and its cost is not known to be monotone in it, so no bound covers the range; make it a "
                f"tune.choice of values (monotone ranges: {', '.join(planner.monotone) or 'none'})"
            )
        if not isinstance(param, (Choice, Interval)):
            raise ConfigError(f"refusing a DP sweep: '{key}' is not a bounded choice or interval")
    return relevant


def _worst_corner(slot_events: list, orders, curve_of) -> object:
    """The event whose RDP curve dominates every other's at every order (refused if none does)."""
    curves = [curve_of(e) for e in slot_events]
    for event, curve in zip(slot_events, curves):
        # orders dp_accounting could not evaluate (inf) carry no ordering information
        if all(np.all((curve >= other * (1 - 1e-9) - 1e-12) | ~np.isfinite(curve) | ~np.isfinite(other))
               for other in curves):
            return event
    raise ConfigError(
        "refusing a DP sweep: a declared-monotone range gives events whose RDP curves cross inside one cell "
        f"({', '.join(sorted({e.kind for e in slot_events}))}); no corner bounds the cell"
    )


def bound_sweep(planner: Planner, space: SearchSpace, config_for: Callable[[dict], dict], privacy,
                cells_per_interval: int = 4) -> SweepBound:
    """The selection event over the whole ``space``; ``config_for(params)`` builds a trial's config."""
    relevant = _relevant_space(planner, space)
    fixed = {k: p.fixed() for k, p in space.items() if k not in relevant}
    with _quiet_absl():
        return _bound(planner, relevant, fixed, config_for, privacy, cells_per_interval)


@contextlib.contextmanager
def _quiet_absl():
    """dp_accounting logs a warning per RDP order it drops (fractional orders at large q); dozens per point."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _bound(planner: Planner, relevant: SearchSpace, fixed: dict, config_for, privacy, cells_per_interval: int):
    from dpsynth_core.privacy.events import SelectionEvent, rdp_curve, rdp_orders

    cells = grid_cells(relevant, cells_per_interval)
    points = {tuple(sorted(c.items())) for cell in cells for c in cell}
    if len(points) > MAX_PLANNED_POINTS:
        raise ConfigError(f"refusing a DP sweep: bounding the space needs {len(points)} planned trials "
                          f"(> {MAX_PLANNED_POINTS}); narrow the privacy-relevant part of the space")
    plans: dict[tuple, TrialPlan] = {}
    for point in points:
        plans[point] = planner.plan(config_for({**fixed, **dict(point)}))
    deltas = {p.delta for p in plans.values()}
    datasets = {p.dataset for p in plans.values()}
    if len(deltas) != 1 or len(datasets) != 1:
        raise ConfigError("refusing a DP sweep: the space changes the trials' delta or dataset; one ledger "
                          "composes at one delta on one dataset")

    orders = rdp_orders()
    curve_cache: dict = {}

    def curve_of(event):
        if event not in curve_cache:
            curve_cache[event] = rdp_curve([event], orders)
        return curve_cache[event]

    candidates = []
    for cell in cells:
        corner_events = [plans[tuple(sorted(c.items()))].events for c in cell]
        shapes = {tuple(e.kind for e in events) for events in corner_events}
        if len(shapes) != 1:
            raise ConfigError("refusing a DP sweep: the trials of one cell spend different kinds of events")
        worst = tuple(_worst_corner([events[i] for events in corner_events], orders, curve_of)
                      for i in range(len(corner_events[0])))
        if worst not in candidates:
            candidates.append(worst)
    event = SelectionEvent(candidates=tuple(candidates), mean_trials=privacy.mean_trials,
                           distribution=privacy.distribution)
    delta = deltas.pop()
    return SweepBound(event=event, epsilon=event.epsilon(delta), delta=delta, dataset=datasets.pop(),
                      planned_points=len(points))
