"""Plain (non-subsampled) Gaussian mechanism composed T times, accounted exactly.

The Gaussian mechanism with noise multiplier ``s`` (= sigma / L2 sensitivity) is mu-GDP with
``mu = 1 / s``; T-fold composition is exactly ``mu = sqrt(T) / s``-GDP (Dong, Roth, Su 2019).
Its privacy profile is the analytic Gaussian formula of Balle & Wang (2018):

    delta(eps) = Phi(-eps/mu + mu/2) - exp(eps) * Phi(-eps/mu - mu/2)

which we invert for eps by root finding (delta(eps) is strictly decreasing in eps).
This is exact: no discretisation, no slack. Used for the histograms of Private Evolution / WASP.
"""

from __future__ import annotations

import math

from scipy import optimize, special

from dpsynth_core.privacy._validate import (
    PrivacyParameterError,
    check_count,
    check_delta,
    check_positive,
)


def _log_ndtr(x: float) -> float:
    return float(special.log_ndtr(x))


def gdp_delta(mu: float, epsilon: float) -> float:
    """delta(eps) of a mu-GDP mechanism (Balle-Wang analytic Gaussian), computed stably in logs."""
    a = _log_ndtr(-epsilon / mu + mu / 2.0)
    b = epsilon + _log_ndtr(-epsilon / mu - mu / 2.0)
    if b >= a:  # only from rounding when delta is ~0
        return 0.0
    return float(math.exp(a) * -math.expm1(b - a))


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest eps >= 0 with delta(eps) <= delta for a mu-GDP mechanism."""
    mu = check_positive("mu", mu)
    delta = check_delta(delta)
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    hi = 1.0
    while gdp_delta(mu, hi) > delta:
        hi *= 2.0
        if hi > 1e6:
            raise PrivacyParameterError(f"epsilon diverges for mu={mu}, delta={delta}")
    # Root of a decreasing function; return the upper end of the bracket so we never under-report.
    root = optimize.brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, hi, xtol=1e-12, rtol=1e-12)
    while gdp_delta(mu, root) > delta:
        root = math.nextafter(root, math.inf) * (1 + 1e-12)
    return float(root)


def gaussian_epsilon(noise_multiplier: float, compositions: int, delta: float) -> float:
    """Exact eps at ``delta`` of the Gaussian mechanism (noise_multiplier = sigma / sensitivity) run
    ``compositions`` times."""
    s = check_positive("noise_multiplier", noise_multiplier)
    t = check_count("compositions", compositions)
    delta = check_delta(delta)
    return gdp_epsilon(math.sqrt(t) / s, delta)


def calibrate_gaussian_noise(target_epsilon: float, delta: float, compositions: int = 1) -> float:
    """Smallest noise multiplier (sigma / sensitivity) such that ``compositions`` Gaussian releases
    are (target_epsilon, delta)-DP. Exact: solves the analytic-Gaussian equation for mu."""
    eps = check_positive("target_epsilon", target_epsilon)
    delta = check_delta(delta)
    t = check_count("compositions", compositions)
    # delta(eps; mu) increases with mu: find mu with delta(eps; mu) = delta.
    lo, hi = 1e-6, 1.0
    while gdp_delta(hi, eps) < delta:
        hi *= 2.0
    mu = optimize.brentq(lambda m: gdp_delta(m, eps) - delta, lo, hi, xtol=1e-14, rtol=1e-13)
    sigma = math.sqrt(t) / mu
    # Round towards more noise until the guarantee holds exactly.
    while gaussian_epsilon(sigma, t, delta) > eps:
        sigma *= 1 + 1e-12
    return float(sigma)
