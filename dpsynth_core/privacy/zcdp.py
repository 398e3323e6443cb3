"""zero-Concentrated DP (rho-zCDP) <-> (eps, delta)-DP.

Conversion of Canonne, Kamath & Steinke (2020, "The Discrete Gaussian for Differential
Privacy", Prop. 12 / Cor. 13), the one used by AIM's reference code (McKenna's ``cdp2adp``) and
by OpenDP's ``make_zCDP_to_approxDP`` which smartnoise-synth calls: a rho-zCDP mechanism is
(eps, delta)-DP with

    delta = inf_{alpha > 1}  exp((alpha - 1) * (alpha * rho - eps)) / (alpha - 1) * (1 - 1/alpha)^alpha

Any alpha gives a valid delta, so an imperfect search only makes delta larger (still valid).
The optimum alpha solves (2 alpha - 1) rho - eps + log(1 - 1/alpha) = 0 (increasing in alpha),
which we find by bisection. rho -> eps and eps -> rho are then bisections on a monotone map,
each ending on the safe side (eps rounded up, rho rounded down).
"""

from __future__ import annotations

import math

from dpsynth_core.privacy._validate import check_delta, check_positive

_ALPHA_MIN = 1.0 + 1e-9
_ITERATIONS = 200


def zcdp_delta(rho: float, epsilon: float) -> float:
    """delta such that a rho-zCDP mechanism is (epsilon, delta)-DP (CKS 2020)."""
    if rho < 0 or epsilon < 0:
        raise ValueError(f"rho and epsilon must be >= 0, got rho={rho}, epsilon={epsilon}")
    if rho == 0:
        return 0.0
    lo, hi = _ALPHA_MIN, (epsilon + 1.0) / (2.0 * rho) + 2.0
    for _ in range(_ITERATIONS):
        alpha = 0.5 * (lo + hi)
        derivative = (2.0 * alpha - 1.0) * rho - epsilon + math.log1p(-1.0 / alpha)
        if derivative < 0:
            lo = alpha
        else:
            hi = alpha
    alpha = 0.5 * (lo + hi)
    log_delta = (alpha - 1.0) * (alpha * rho - epsilon) + alpha * math.log1p(-1.0 / alpha) - math.log(alpha - 1.0)
    return min(1.0, math.exp(min(log_delta, 0.0)))


def zcdp_to_epsilon(rho: float, delta: float) -> float:
    """Smallest epsilon (up to 1e-12 relative) with zcdp_delta(rho, epsilon) <= delta."""
    rho = check_positive("rho", rho)
    delta = check_delta(delta)
    lo = 0.0
    hi = rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))  # the classic (looser) bound is valid
    while zcdp_delta(rho, hi) > delta:  # safety: never start below the answer
        hi *= 2.0
    for _ in range(_ITERATIONS):
        mid = 0.5 * (lo + hi)
        if zcdp_delta(rho, mid) <= delta:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-13 * max(1.0, hi):
            break
    return hi


def epsilon_to_zcdp(epsilon: float, delta: float) -> float:
    """Largest rho (rounded down) such that rho-zCDP implies (epsilon, delta)-DP."""
    epsilon = check_positive("epsilon", epsilon)
    delta = check_delta(delta)
    lo, hi = 0.0, epsilon + 1.0
    for _ in range(_ITERATIONS):
        mid = 0.5 * (lo + hi)
        if zcdp_delta(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-14 * max(1e-12, lo):
            break
    return lo
