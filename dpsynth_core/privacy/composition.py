"""Compose a list of privacy events into ONE (epsilon, delta) guarantee -- never by adding eps's.

Why the result is a valid (never under-reported) epsilon at the ledger's delta:

* Post-processing events cost nothing (post-processing theorem); they are dropped.
* DP-SGD (Poisson-subsampled Gaussian) and plain Gaussian events have exact privacy-loss
  distributions. Their composition is computed with dp_accounting's PLD using *pessimistic*
  discretisation, which upper-bounds the true hockey-stick divergence. If there is no zCDP event
  this is the answer (candidate ``pld``), together with the other candidates below.
* A rho-zCDP event (AIM) is not a fixed mechanism, so it has no PLD. We compute several upper
  bounds, each valid on its own, and report their MINIMUM (the min of valid upper bounds is a
  valid upper bound):

  (a) ``rdp``: Renyi-DP composition of everything. A rho-zCDP event is exactly RDP with
      eps(alpha) = rho * alpha at every order; subsampled and plain Gaussians use
      dp_accounting's RDP formulas; RDP composes additively per order; the RDP -> (eps, delta)
      conversion is dp_accounting's (Balle et al. 2020, Prop. 12).
  (b) ``pld+adp(f)``: each zCDP event i is converted (Canonne-Kamath-Steinke 2020) to an
      (eps_i, delta_i)-DP guarantee with delta_i = f * delta / k (k zCDP events, f from a small
      grid). An (eps_i, delta_i)-DP mechanism is dominated by the pessimistic PLD of
      dp_accounting's ``from_privacy_parameters`` (mass delta_i at +infinity). Composing those
      with the exact DP-SGD / Gaussian PLDs and reading epsilon at the ledger's delta accounts
      for the delta_i exactly (the +infinity masses enter the hockey-stick divergence); when
      they leave no room (infinite epsilon) the candidate is dropped.
  (c) ``zcdp``: when there is no DP-SGD event, everything is zCDP: a Gaussian with noise
      multiplier s released T times is exactly (T / 2 s^2)-zCDP, zCDP composes by adding rho,
      and the CKS conversion turns the total rho into (eps, delta).

* A ``SelectionEvent`` (DP hyperparameter selection) is bounded in RDP only; with one present
  the ``rdp`` candidate is the answer.

All events are stated under add/remove-one neighbouring (dp_accounting's default).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from dpsynth_core.privacy.accountants import PLD_COARSE_DISCRETIZATION, PLD_DISCRETIZATION, subsampled_gaussian_pld
from dpsynth_core.privacy.events import (
    DpSgdEvent,
    GaussianEvent,
    PostProcessingEvent,
    SelectionEvent,
    ZCdpEvent,
    rdp_curve,
    rdp_orders,
)
from dpsynth_core.privacy.zcdp import zcdp_to_epsilon

DELTA_SPLITS = (0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9)


def _private_events(events: Sequence) -> tuple:
    return tuple(e for e in events if not isinstance(e, PostProcessingEvent))


def _pld_of(event: DpSgdEvent | GaussianEvent, discretization: float):
    from dp_accounting.pld import privacy_loss_distribution as pld

    if isinstance(event, DpSgdEvent):  # the one-step PLD is shared with epsilon_dpsgd (built once per sigma and q)
        return subsampled_gaussian_pld(event.sampling_rate, event.noise_multiplier, discretization).self_compose(
            event.steps)
    # T Gaussian releases with multiplier s are exactly one Gaussian with multiplier s / sqrt(T).
    return pld.from_gaussian_mechanism(
        standard_deviation=event.noise_multiplier / math.sqrt(event.compositions),
        value_discretization_interval=discretization,
    )


def _rdp_epsilon(events: tuple, delta: float) -> float:
    from dp_accounting.rdp import rdp_privacy_accountant

    orders = rdp_orders()
    eps, _ = rdp_privacy_accountant.compute_epsilon(orders, rdp_curve(events, orders), delta)
    return float(eps)


def _pld_candidates(events: tuple, delta: float, discretization: float = PLD_DISCRETIZATION) -> dict[str, float]:
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld

    if any(isinstance(e, SelectionEvent) for e in events):
        return {}  # a DP selection is bounded in RDP only (see SelectionEvent)
    exact = [e for e in events if not isinstance(e, ZCdpEvent)]
    zcdp = [e for e in events if isinstance(e, ZCdpEvent)]
    base = None
    for event in exact:
        base = _pld_of(event, discretization) if base is None else base.compose(_pld_of(event, discretization))
    if not zcdp:
        return {"pld": float(base.get_epsilon_for_delta(delta))}
    out: dict[str, float] = {}
    for f in DELTA_SPLITS:
        delta_i = f * delta / len(zcdp)
        composed = base
        for event in zcdp:
            eps_i = zcdp_to_epsilon(event.rho, delta_i)
            approx = pld.from_privacy_parameters(
                common.DifferentialPrivacyParameters(epsilon=eps_i, delta=delta_i),
                value_discretization_interval=discretization,
            )
            composed = approx if composed is None else composed.compose(approx)
        eps = float(composed.get_epsilon_for_delta(delta))
        if math.isfinite(eps):
            out[f"pld+adp(f={f})"] = eps
    return out


@functools.lru_cache(maxsize=256)
def _compose_cached(events: tuple, delta: float) -> tuple[float, str, tuple]:
    candidates: dict[str, float] = {"rdp": _rdp_epsilon(events, delta)}
    candidates.update(_pld_candidates(events, delta))
    if not any(isinstance(e, (DpSgdEvent, SelectionEvent)) for e in events):
        rho = sum(e.rho for e in events)  # ZCdpEvent.rho, GaussianEvent.rho (exact)
        candidates["zcdp"] = zcdp_to_epsilon(rho, delta)
    finite = {k: v for k, v in candidates.items() if math.isfinite(v)}
    if not finite:
        return math.inf, "none", tuple(sorted(candidates.items()))
    best = min(finite, key=finite.get)
    return finite[best], best, tuple(sorted(candidates.items()))


def compose_epsilon(events: Sequence, delta: float) -> float:
    """Epsilon at ``delta`` of all ``events`` composed (see module docstring for the argument)."""
    return compose_with_details(events, delta)[0]


def compose_with_details(events: Sequence, delta: float) -> tuple[float, str, dict[str, float]]:
    """(epsilon, name of the tightest bound, every candidate bound) for ``events`` at ``delta``."""
    private = _private_events(events)
    if not private:
        return 0.0, "none", {}
    eps, method, candidates = _compose_cached(private, float(delta))
    return eps, method, dict(candidates)


@functools.lru_cache(maxsize=256)
def _upper_bound_cached(events: tuple, delta: float) -> float:
    finite = [v for v in _pld_candidates(events, delta, PLD_COARSE_DISCRETIZATION).values() if math.isfinite(v)]
    return min(finite) if finite else _compose_cached(events, delta)[0]


def compose_upper_bound(events: Sequence, delta: float) -> float:
    """A few times faster than :func:`compose_epsilon` and not below it, up to rounding: the PLD candidates on a
    10x coarser grid of the same nested, pessimistic kind, without RDP (events with no PLD candidate fall back to
    the exact composition). For searches over a noise multiplier only: what a search finds is checked with
    :func:`compose_epsilon` before it is used, and only that figure is recorded."""
    private = _private_events(events)
    return _upper_bound_cached(private, float(delta)) if private else 0.0
