"""Accountants, calibration, Gaussian composition and zCDP conversion, checked against
computations written here independently of dp_accounting / prv_accountant."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, special, stats

from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy import (
    PrivacyParameterError,
    calibrate_gaussian_noise,
    calibrate_noise_multiplier,
    default_delta,
    epsilon_dpsgd,
    epsilon_to_zcdp,
    gaussian_epsilon,
    zcdp_to_epsilon,
)

DELTA = 1e-5
# (q, sigma, steps): small/large q, low/high noise, full batch.
GRID = [(0.01, 1.0, 1000), (0.02, 0.8, 500), (0.05, 1.5, 200), (0.1, 2.0, 100), (1.0, 5.0, 10)]


# --------------------------------------------------------------------------- independent PLD
def _step_loss_pmf(q: float, sigma: float, direction: str, h: float, n: int) -> tuple[np.ndarray, float]:
    """Privacy-loss pmf of one Poisson-subsampled Gaussian step, on a circular grid of n bins of
    width h (bin 0 = loss 0). Each loss mass is split between its two neighbouring bins so the
    mean is preserved. Returns (pmf, mass at +infinity)."""
    edges = np.linspace(-14.0 * sigma, 1.0 + 14.0 * sigma, 400_001)
    mid = 0.5 * (edges[1:] + edges[:-1])
    log_one_minus_q = math.log1p(-q) if q < 1 else -np.inf
    # log( ((1-q) N(0, s^2) + q N(1, s^2)) / N(0, s^2) ) at x
    log_ratio = np.logaddexp(log_one_minus_q, math.log(q) + (2.0 * mid - 1.0) / (2.0 * sigma**2))
    if direction == "remove":  # x from the mixture
        cdf = (1 - q) * stats.norm.cdf(edges, 0, sigma) + q * stats.norm.cdf(edges, 1, sigma)
        loss, inf_mass = log_ratio, max(0.0, 1.0 - cdf[-1])
    else:  # x from N(0, s^2)
        cdf = stats.norm.cdf(edges, 0, sigma)
        loss, inf_mass = -log_ratio, 0.0
    mass = np.diff(cdf)
    pos = loss / h
    i0 = np.floor(pos).astype(np.int64)
    frac = pos - i0
    pmf = np.zeros(n)
    np.add.at(pmf, i0 % n, mass * (1 - frac))
    np.add.at(pmf, (i0 + 1) % n, mass * frac)
    return pmf, inf_mass


def independent_pld_epsilon(q: float, sigma: float, steps: int, delta: float, h: float = 2e-4) -> float:
    """eps(delta) of T-fold Poisson-subsampled Gaussian under add/remove: compose the discretised
    loss pmf by FFT, delta(eps) = E[(1 - exp(eps - L))_+] + P[L = inf], invert by bisection,
    take the worse of the two directions."""
    n = int(80.0 / h)
    losses = np.where(np.arange(n) < n // 2, np.arange(n), np.arange(n) - n) * h
    worst = 0.0
    for direction in ("remove", "add"):
        pmf, inf_mass = _step_loss_pmf(q, sigma, direction, h, n)
        composed = np.clip(np.fft.irfft(np.fft.rfft(pmf) ** steps, n), 0.0, None)
        inf_total = 1.0 - (1.0 - inf_mass) ** steps

        def delta_of(eps: float) -> float:
            m = losses > eps
            return float(np.sum(composed[m] * -np.expm1(eps - losses[m]))) + inf_total

        lo, hi = 0.0, 1.0
        while delta_of(hi) > delta:
            hi *= 2.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if delta_of(mid) > delta else (lo, mid)
        worst = max(worst, hi)
    return worst


# --------------------------------------------------------------------------- independent RDP
def independent_rdp_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    """Integer-order RDP of the subsampled Gaussian, closed form of Mironov, Talwar & Zhang 2019:
    A_a = sum_k C(a,k) (1-q)^(a-k) q^k exp((k^2 - k) / (2 sigma^2)), RDP(a) = log(A_a) / (a - 1),
    converted with eps = T RDP(a) + log1p(-1/a) - log(delta a) / (a - 1) (Balle et al. 2020)."""
    best = math.inf
    for a in range(2, 257):
        k = np.arange(a + 1)
        with np.errstate(invalid="ignore", divide="ignore"):  # q = 1: only the k = a term survives
            log_one_minus_q = np.where(a - k == 0, 0.0, (a - k) * np.log1p(-q))
        log_terms = (
            special.gammaln(a + 1) - special.gammaln(k + 1) - special.gammaln(a - k + 1)
            + log_one_minus_q + k * math.log(q) + (k * k - k) / (2.0 * sigma**2)
        )
        log_a = special.logsumexp(log_terms)
        rdp = steps * log_a / (a - 1)
        best = min(best, rdp + math.log1p(-1.0 / a) - math.log(delta * a) / (a - 1))
    return best


# --------------------------------------------------------------------------- DP-SGD accountants
@pytest.mark.parametrize("q,sigma,steps", GRID)
def test_accountants_against_independent_computations(q, sigma, steps):
    pld = epsilon_dpsgd(q, sigma, steps, DELTA, "pld")
    prv = epsilon_dpsgd(q, sigma, steps, DELTA, "prv")
    rdp = epsilon_dpsgd(q, sigma, steps, DELTA, "rdp")
    independent = independent_pld_epsilon(q, sigma, steps, DELTA)
    assert abs(prv - pld) / pld < 0.01, (pld, prv)
    assert rdp >= pld, (rdp, pld)
    assert abs(pld - independent) / independent < 0.01, (pld, independent)
    assert pld >= independent * (1 - 1e-3), "PLD must be an upper bound (pessimistic)"
    # dp_accounting's RDP uses all integer orders up to 63 plus fractional ones: never above ours.
    indep_rdp = independent_rdp_epsilon(q, sigma, steps, DELTA)
    assert rdp <= indep_rdp * (1 + 1e-9) and rdp >= 0.97 * indep_rdp, (rdp, indep_rdp)


def test_reference_point_figures():
    assert epsilon_dpsgd(0.01, 1.0, 1000, 1e-5) == pytest.approx(1.83, abs=0.005)
    assert epsilon_dpsgd(0.01, 1.0, 1000, 1e-5, "rdp") == pytest.approx(2.10, abs=0.005)
    assert epsilon_dpsgd(0.01, 1.0, 1000, 1e-5, "prv") == pytest.approx(1.84, abs=0.01)


def test_epsilon_monotone_in_noise_steps_and_delta():
    eps = [epsilon_dpsgd(0.01, s, 200, DELTA) for s in (0.7, 1.0, 2.0)]
    assert all(a > b for a, b in zip(eps, eps[1:]))
    for accountant in ("pld", "rdp"):
        assert epsilon_dpsgd(0.01, 1.0, 100, DELTA, accountant) < epsilon_dpsgd(0.01, 1.0, 200, DELTA, accountant)
        assert epsilon_dpsgd(0.01, 1.0, 200, 1e-3, accountant) < epsilon_dpsgd(0.01, 1.0, 200, DELTA, accountant)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_calibration_round_trip(accountant):
    sigma = calibrate_noise_multiplier(2.0, DELTA, 0.02, 300, accountant)
    achieved = epsilon_dpsgd(0.02, sigma, 300, DELTA, accountant)
    assert 0.99 * 2.0 <= achieved <= 2.0
    # 1 % less noise must break the target: the calibration is (nearly) the smallest sigma.
    assert epsilon_dpsgd(0.02, sigma * 0.99, 300, DELTA, accountant) > 2.0
    if accountant == "rdp":  # more budget, less noise (cheap with RDP)
        assert calibrate_noise_multiplier(4.0, DELTA, 0.02, 300, accountant) < sigma


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(sampling_rate=0.0), "sampling_rate"),
        (dict(sampling_rate=1.5), "sampling_rate"),
        (dict(noise_multiplier=0.0), "noise_multiplier"),
        (dict(noise_multiplier=-1.0), "noise_multiplier"),
        (dict(delta=0.0), "delta"),
        (dict(delta=1.0), "delta"),
        (dict(steps=0), "steps"),
        (dict(steps=2.5), "steps"),
        (dict(accountant="gdp"), "accountant"),
    ],
)
def test_invalid_dpsgd_inputs_are_clear_errors(kwargs, field):
    args = dict(sampling_rate=0.01, noise_multiplier=1.0, steps=10, delta=1e-5) | kwargs
    with pytest.raises(PrivacyParameterError, match=field):
        epsilon_dpsgd(**args)


def test_invalid_calibration_inputs():
    with pytest.raises(ConfigError, match="target_epsilon"):
        calibrate_noise_multiplier(0.0, 1e-5, 0.01, 100)
    with pytest.raises(ValueError, match="delta"):  # also a ValueError for numeric callers
        calibrate_noise_multiplier(1.0, 2.0, 0.01, 100)


# --------------------------------------------------------------------------- plain Gaussian
def _gdp_delta_reference(mu: float, eps: float) -> float:
    return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("sigma,t", [(1.0, 1), (5.0, 10), (20.0, 50), (0.8, 3)])
def test_gaussian_composition_matches_analytic_formula(sigma, t):
    eps = gaussian_epsilon(sigma, t, DELTA)
    mu = math.sqrt(t) / sigma
    # Independent: delta(eps) of mu-GDP (Dong-Roth-Su Cor. 2.13) at the returned eps equals DELTA.
    assert _gdp_delta_reference(mu, eps) == pytest.approx(DELTA, rel=1e-6)
    # Composition is exact: t releases at sigma == one release at sigma / sqrt(t).
    assert eps == pytest.approx(gaussian_epsilon(sigma / math.sqrt(t), 1, DELTA), rel=1e-9)
    # dp_accounting's (pessimistic) PLD is an upper bound and close.
    from dp_accounting.pld import privacy_loss_distribution as pld

    pld_eps = pld.from_gaussian_mechanism(sigma / math.sqrt(t)).get_epsilon_for_delta(DELTA)
    assert eps <= pld_eps * (1 + 1e-9) and pld_eps <= eps * 1.005


def test_gaussian_calibration_round_trip_and_classic_bound():
    for eps, t in [(0.5, 1), (1.0, 10), (4.0, 100)]:
        sigma = calibrate_gaussian_noise(eps, DELTA, t)
        assert gaussian_epsilon(sigma, t, DELTA) <= eps
        assert gaussian_epsilon(sigma, t, DELTA) == pytest.approx(eps, rel=1e-6)
    # The classic sigma = sqrt(2 ln(1.25/delta)) / eps (valid for eps < 1) is never tighter.
    assert calibrate_gaussian_noise(0.5, DELTA) < math.sqrt(2 * math.log(1.25 / DELTA)) / 0.5
    with pytest.raises(PrivacyParameterError, match="compositions"):
        gaussian_epsilon(1.0, 0, DELTA)


# --------------------------------------------------------------------------- zCDP
def test_zcdp_conversion_matches_opendp_and_is_monotone():
    # OpenDP's make_zCDP_to_approxDP (what smartnoise-synth's AIM uses) is an independent
    # implementation of the same Canonne-Kamath-Steinke bound.
    from snsynth.utils import cdp_rho

    for eps, delta in [(1.0, 1e-6), (3.0, 1e-9)]:
        assert epsilon_to_zcdp(eps, delta) == pytest.approx(cdp_rho(eps, delta), rel=1e-6)
    rhos = [0.001, 0.01, 0.1, 1.0, 5.0]
    eps = [zcdp_to_epsilon(r, DELTA) for r in rhos]
    assert all(a < b for a, b in zip(eps, eps[1:]))
    assert zcdp_to_epsilon(0.1, 1e-3) < zcdp_to_epsilon(0.1, 1e-7)
    for r, e in zip(rhos, eps):
        assert e <= r + 2 * math.sqrt(r * math.log(1 / DELTA))  # tighter than the classic bound
        assert epsilon_to_zcdp(e, DELTA) == pytest.approx(r, rel=1e-6)  # round trip


def test_zcdp_reference_point():
    # CKS 2020: delta(eps) = min_a exp((a-1)(a rho - eps)) / a * (1 - 1/a)^(a-1); evaluated here
    # by brute-force minimisation over alpha for rho = 0.5 at the returned eps.
    rho = 0.5
    eps = zcdp_to_epsilon(rho, DELTA)

    def log_delta(a):
        return (a - 1) * (a * rho - eps) - math.log(a) + (a - 1) * math.log1p(-1 / a)

    res = optimize.minimize_scalar(log_delta, bounds=(1.0001, 100), method="bounded", options={"xatol": 1e-10})
    assert math.exp(res.fun) == pytest.approx(DELTA, rel=1e-4)
    assert 4.0 < eps < rho + 2 * math.sqrt(rho * math.log(1 / DELTA))


def test_default_delta_keeps_m_times_delta_small():
    """min(1e-5, m^-1.1): m * delta stays below 1e-5 * m and below m^-0.1 (the old 1/(m ln m) left
    m * delta = 1/ln m: 0.14 at m = 1,500)."""
    assert default_delta(1500) == 1e-5 and default_delta(32) == 1e-5
    assert default_delta(100_000) == pytest.approx(100_000 ** -1.1) and 100_000 ** -1.1 < 1e-5
    for m in (2, 32, 300, 1500, 35_000, 10**6):
        assert m * default_delta(m) <= min(1e-5 * m, m ** -0.1) * (1 + 1e-12)
    assert 1000 * default_delta(1000) == pytest.approx(0.01) and 1 / math.log(1000) > 0.14  # the old m * delta
    with pytest.raises(ConfigError):
        default_delta(1)


@pytest.mark.parametrize("shape", ["power", "exponential"])
@pytest.mark.parametrize("k", [1.0, 3.0, 8.0])
def test_interpolated_noise_lands_in_the_window_on_the_safe_side(shape, k):
    """A decreasing eps(sigma): the returned sigma has floor <= eps <= target, in few calls."""
    from dpsynth_core.privacy.accountants import interpolate_noise_multiplier

    calls = []

    def eps_of(sigma):
        calls.append(sigma)
        return sigma**-k if shape == "power" else 10.0 * math.exp(-k * sigma)

    sigma = interpolate_noise_multiplier(eps_of, 0.25, 4.0, target=1.0, floor=0.998)
    assert 0.998 <= eps_of(sigma) <= 1.0
    assert len(calls) <= 16


@pytest.mark.timeout(120)
def test_weak_privacy_answers_in_seconds_with_a_valid_bound():
    """sigma = 0.02 at q = 0.01, T = 1000 made PLD run for minutes; above WEAK_PRIVACY_EPSILON every
    accountant reports the RDP bound (an upper bound: never under-reports), and calibration to a
    huge epsilon terminates."""
    from dpsynth_core.privacy.accountants import WEAK_PRIVACY_EPSILON, _rdp_epsilon

    rdp = _rdp_epsilon(0.01, 0.02, 1000, 1e-5)
    assert rdp > WEAK_PRIVACY_EPSILON
    for name in ("pld", "prv"):
        assert epsilon_dpsgd(0.01, 0.02, 1000, 1e-5, name) == rdp
    sigma = calibrate_noise_multiplier(1e6, 1e-5, 0.01, 1000)
    assert epsilon_dpsgd(0.01, sigma, 1000, 1e-5) <= 1e6


def test_dp_accounting_convergence_notes_do_not_reach_the_user(caplog):
    """q = 0.2, sigma ~ 1.13 (an audit's DP-SGD) made dp_accounting log dozens of
    '_compute_log_a_frac failed to converge' warnings per calibration."""
    import logging

    with caplog.at_level(logging.WARNING):
        epsilon_dpsgd(0.2, 1.1337, 10, 1e-5, "rdp")
    assert not [r for r in caplog.records if "failed to converge" in r.getMessage()]
    logging.getLogger("absl").warning("an unrelated absl warning %s", "passes")
    assert any("unrelated" in r.getMessage() for r in caplog.records)
