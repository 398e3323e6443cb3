"""Accountants for the Poisson-subsampled Gaussian mechanism (DP-SGD).

Three numerical accountants, all under add/remove-one neighbouring:

* ``pld`` (default): Google's dp_accounting privacy-loss-distribution accountant with
  pessimistic discretisation (interval 1e-4) -- an upper bound, and the tightest of the three.
* ``rdp``: dp_accounting's Renyi-DP accountant (Mironov et al. 2019 orders, improved conversion
  of Balle et al. 2020). Valid but looser (about +15 % at q=0.01, sigma=1, T=1000).
* ``prv``: Microsoft's prv_accountant (Gopi et al. 2021); we report its *upper* bound, with
  eps_error = min(0.01, 0.5 % of epsilon), so that it never under-reports.

``calibrate_noise_multiplier`` bisects sigma (eps is decreasing in sigma) and always returns a
sigma whose epsilon, by the chosen accountant at full precision, is <= the target.
"""

from __future__ import annotations

import functools
import logging
import math

from dpsynth_core.privacy._validate import (
    PrivacyParameterError,
    check_count,
    check_delta,
    check_positive,
    check_sampling_rate,
)

ACCOUNTANTS = ("pld", "rdp", "prv")
PLD_DISCRETIZATION = 1e-4
PLD_COARSE_DISCRETIZATION = 1e-3  # a 10x coarser grid: faster, still pessimistic (an upper bound)
PRV_EPS_ERROR = 0.01
# Above this epsilon every accountant reports the RDP bound: PLD and PRV grids grow with epsilon
# (sigma = 0.02 at q = 0.01, T = 1000 runs for minutes), RDP answers in milliseconds, and it is a
# valid upper bound -- at such epsilons no tighter figure changes what the guarantee means.
WEAK_PRIVACY_EPSILON = 64.0


class _DropDpAccountingChatter(logging.Filter):
    """dp_accounting's RDP code logs convergence notes through absl on every call (dozens per
    ledger); a user cannot act on them. Only those messages are dropped, other absl logs pass
    (the records carry absl's own path, not dp_accounting's, so they are told by their text)."""

    NOTES = ("_compute_log_a_frac failed to converge", "Negative Renyi divergence")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.NOTES)


logging.getLogger("absl").addFilter(_DropDpAccountingChatter())


def _check_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise PrivacyParameterError(f"accountant must be one of {', '.join(ACCOUNTANTS)}; got {accountant!r}")
    return accountant


def dpsgd_dp_event(sampling_rate: float, noise_multiplier: float, steps: int):
    """The dp_accounting event of ``steps`` Poisson-subsampled Gaussian steps."""
    import dp_accounting

    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier)),
        steps,
    )


@functools.lru_cache(maxsize=8)  # a few MB each at the 1e-4 grid (~20 MB at sigma 0.2, q 1)
def subsampled_gaussian_pld(q: float, sigma: float, discretization: float):
    """dp_accounting's pessimistic PLD of ONE Poisson-subsampled Gaussian step. Building it is most of
    a PLD epsilon's cost (~1 s at the 1e-4 grid); it is kept and self-composed for any step count (a
    run's epsilon after each step, the ledger's composition of the same event)."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    return pld.from_gaussian_mechanism(
        standard_deviation=sigma,
        value_discretization_interval=discretization,
        sampling_prob=q,
        neighboring_relation=pld.NeighborRel.ADD_OR_REMOVE_ONE,
    )


@functools.lru_cache(maxsize=4096)
def _pld_epsilon(q: float, sigma: float, steps: int, delta: float, discretization: float) -> float:
    # What PLDAccountant(discretization).compose(dpsgd_dp_event(...)).get_epsilon(delta) computes, call
    # for call (identity composed with the step's PLD self-composed), with the one-step PLD shared:
    # the same float (tests/test_privacy_accountant_speed.py checks it against the accountant).
    from dp_accounting.pld import privacy_loss_distribution as pld

    composed = pld.identity(value_discretization_interval=discretization).compose(
        subsampled_gaussian_pld(q, sigma, discretization).self_compose(steps)
    )
    return float(composed.get_epsilon_for_delta(delta))


@functools.lru_cache(maxsize=4096)
def _rdp_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    from dp_accounting.rdp import rdp_privacy_accountant

    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dpsgd_dp_event(q, sigma, steps))
    return float(acc.get_epsilon(delta))


# Integer orders of dp_accounting's default RDP orders (its cheap closed form; the fractional orders
# cost ~0.3 s a call). RDP's epsilon is the minimum over the orders, so over a subset it is never
# below the full figure: a subset at or under WEAK_PRIVACY_EPSILON settles "not weak" exactly.
_WEAK_CHECK_ORDERS = (2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 63.0)


@functools.lru_cache(maxsize=4096)
def _is_weak_privacy(q: float, sigma: float, steps: int, delta: float) -> bool:
    """``_rdp_epsilon(q, sigma, steps, delta) > WEAK_PRIVACY_EPSILON``, with the full RDP curve computed
    only when a few integer orders do not already bound it below the threshold."""
    from dp_accounting.rdp import rdp_privacy_accountant

    acc = rdp_privacy_accountant.RdpAccountant(list(_WEAK_CHECK_ORDERS))
    acc.compose(dpsgd_dp_event(q, sigma, steps))
    if acc.get_epsilon(delta) <= WEAK_PRIVACY_EPSILON:
        return False
    return _rdp_epsilon(q, sigma, steps, delta) > WEAK_PRIVACY_EPSILON


@functools.lru_cache(maxsize=1024)
def _prv_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant

    def upper_bound(eps_error: float) -> tuple[float, float]:
        acc = PRVAccountant(
            prvs=[PoissonSubsampledGaussianMechanism(noise_multiplier=sigma, sampling_probability=q)],
            max_self_compositions=[steps],
            eps_error=eps_error,
            delta_error=delta / 1000.0,
        )
        _, estimate, upper = acc.compute_epsilon(delta=delta, num_self_compositions=[steps])
        return float(estimate), float(upper)

    try:
        estimate, upper = upper_bound(PRV_EPS_ERROR)
        # Keep the slack of the reported upper bound within ~0.5 % of epsilon for small epsilons.
        if PRV_EPS_ERROR > 0.005 * estimate:
            estimate, upper = upper_bound(max(0.005 * estimate, 1e-3))
    except (ValueError, RuntimeError, OverflowError, FloatingPointError) as exc:
        raise PrivacyParameterError(
            f"PRV accountant failed for sampling_rate={q}, noise_multiplier={sigma}, steps={steps}, "
            f"delta={delta}: {exc}; use accountant='pld'"
        ) from None
    return float(upper)


def epsilon_dpsgd(
    sampling_rate: float, noise_multiplier: float, steps: int, delta: float, accountant: str = "pld"
) -> float:
    """Epsilon at ``delta`` of DP-SGD: ``steps`` Poisson-subsampled Gaussian steps with sampling
    rate ``sampling_rate`` and noise multiplier ``noise_multiplier`` (sigma / clipping norm)."""
    q = check_sampling_rate(sampling_rate)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    steps = check_count("steps", steps)
    delta = check_delta(delta)
    accountant = _check_accountant(accountant)
    if accountant == "rdp" or _is_weak_privacy(q, sigma, steps, delta):
        return _rdp_epsilon(q, sigma, steps, delta)
    if accountant == "pld":
        return _pld_epsilon(q, sigma, steps, delta, PLD_DISCRETIZATION)
    return _prv_epsilon(q, sigma, steps, delta)


_SIGMA_MIN, _SIGMA_MAX = 1e-2, 1e4
_SIGMA_RTOL = 5e-4


_MAX_GUESSES = 8


def _plain_bisection(eps_of, lo: float, hi: float, target: float) -> float:
    while hi / lo > 1.0 + _SIGMA_RTOL:
        mid = math.sqrt(lo * hi)
        if eps_of(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def bisect_noise_multiplier(eps_of, lo: float, hi: float, target: float) -> float:
    """Geometric bisection on [lo, hi] with eps_of(lo) > target >= eps_of(hi); returns the upper end
    (the noisier side, so the guarantee holds), to ~0.05 %.

    The midpoints and the result are the plain bisection's (``_plain_bisection``), but a midpoint is
    evaluated only when what is known does not settle it: eps falls as sigma grows, so a sigma at or
    above one that met the target meets it, and one at or below a sigma that missed misses. Guesses of
    the crossing (secant of log eps against log sigma, close to a power law) shrink that known bracket
    in a few calls, and most midpoints are then settled without one: a ledger's PLD composition costs
    about a second a call, and bisection makes a dozen. ``eps_of(lo)`` and ``eps_of(hi)`` are asked
    again (callers cache them). The result is evaluated before it is returned; were eps not monotone
    there, the plain bisection's answer is returned instead."""
    start = (lo, hi)
    # known: eps_of(a) > target >= eps_of(b), and their gaps log(eps) - log(target)
    a, b = lo, hi
    gap_a, gap_b = _log_gap(eps_of(lo), target), _log_gap(eps_of(hi), target)
    guesses, side = 0, ""
    while hi / lo > 1.0 + _SIGMA_RTOL:
        mid = math.sqrt(lo * hi)
        while a < mid < b:  # not settled yet: evaluate a guess of the crossing near mid, or mid itself
            probe = mid
            if guesses < _MAX_GUESSES and math.isfinite(gap_a) and math.isfinite(gap_b) and gap_a > gap_b:
                guesses += 1
                x_a, x_b = math.log(a), math.log(b)
                guess = math.exp(x_b - gap_b * (x_b - x_a) / (gap_b - gap_a))
                # a hair to the side of mid it is on: a good guess then settles mid in this one call
                nudge = 1.0 + _SIGMA_RTOL / 4
                probe = min(guess * nudge, mid) if guess <= mid else max(guess / nudge, mid)
            eps = eps_of(probe)
            if eps <= target:
                b, gap_b = probe, _log_gap(eps, target)
                gap_a = gap_a / 2.0 if side == "b" else gap_a  # Illinois: a stale end must not stall the guesses
                side = "b"
            else:
                a, gap_a = probe, _log_gap(eps, target)
                gap_b = gap_b / 2.0 if side == "a" else gap_b
                side = "a"
        if mid >= b:
            hi = mid
        else:
            lo = mid
    if eps_of(hi) <= target:
        return hi
    return _plain_bisection(eps_of, *start, target)


def _log_gap(eps: float, target: float) -> float:
    return math.log(max(eps, 1e-300)) - math.log(target)


def interpolate_noise_multiplier(eps_of, lo: float, hi: float, target: float, floor: float, max_evals: int = 40) -> float:
    """A noise multiplier with ``floor <= eps_of(sigma) <= target``, given ``eps_of(lo) > target >=
    eps_of(hi)``: regula falsi (Illinois) on log(eps) against log(sigma), where epsilon is close to a
    power law. For expensive ``eps_of`` (a ledger's PLD composition, ~1 s a call) it needs a few
    calls where bisection needs a dozen. Returns the best sigma found on the safe side
    (``eps_of <= target``) if the window is not reached in ``max_evals`` calls."""

    def g(x: float) -> float:
        return math.log(max(eps_of(math.exp(x)), 1e-300)) - math.log(target)

    x_lo, x_hi = math.log(lo), math.log(hi)
    g_lo, g_hi = g(x_lo), g(x_hi)
    hi_value = g_hi  # g_hi itself may be scaled down by the Illinois step; the window test uses this
    window = math.log(floor) - math.log(target)
    side = 0
    for _ in range(max_evals):
        if hi_value >= window:  # hi is inside the window (hi_value <= 0 always holds)
            break
        x = x_hi - g_hi * (x_hi - x_lo) / (g_hi - g_lo)
        if not (min(x_lo, x_hi) < x < max(x_lo, x_hi)):
            x = 0.5 * (x_lo + x_hi)
        gx = g(x)
        if gx <= 0:
            x_hi, g_hi, hi_value = x, gx, gx
            if side == -1:
                g_lo /= 2.0  # Illinois: keep the stale end from stalling the interpolation
            side = -1
        else:
            x_lo, g_lo = x, gx
            if side == 1:
                g_hi /= 2.0
            side = 1
    return math.exp(x_hi)


def calibrate_noise_multiplier(
    target_epsilon: float, delta: float, sampling_rate: float, steps: int, accountant: str = "pld"
) -> float:
    """Smallest noise multiplier (to ~0.1 %) with ``epsilon_dpsgd(...) <= target_epsilon``.

    Bisection in log(sigma). For PLD the search runs on a coarser (still pessimistic) grid; the
    result is then checked at full precision, refined there when the coarse grid was more than
    0.2 % conservative (long runs), and nudged up if needed so the guarantee always holds.
    PRV calibration is slow for long runs (tens of seconds); PLD is the default.
    """
    target = check_positive("target_epsilon", target_epsilon)
    delta = check_delta(delta)
    q = check_sampling_rate(sampling_rate)
    steps = check_count("steps", steps)
    accountant = _check_accountant(accountant)

    def search_eps(sigma: float) -> float:
        if accountant == "pld" and not _is_weak_privacy(q, sigma, steps, delta):
            return _pld_epsilon(q, sigma, steps, delta, PLD_COARSE_DISCRETIZATION)
        return epsilon_dpsgd(q, sigma, steps, delta, accountant)

    def final_eps(sigma: float) -> float:
        return epsilon_dpsgd(q, sigma, steps, delta, accountant)

    # Bracket [lo, hi] with eps(lo) > target >= eps(hi), starting at sigma = 1.
    hi = 1.0
    while search_eps(hi) > target:
        hi *= 2.0
        if hi > _SIGMA_MAX:
            raise PrivacyParameterError(
                f"no noise multiplier <= {_SIGMA_MAX:g} reaches epsilon={target} at delta={delta} "
                f"(sampling_rate={q}, steps={steps}); raise epsilon or lower steps/sampling_rate"
            )
    lo = hi / 2.0
    while lo > _SIGMA_MIN and search_eps(lo) <= target:
        hi, lo = lo, lo / 2.0
    if lo <= _SIGMA_MIN:
        return hi  # even tiny noise meets the target: report the smallest sigma we checked
    hi = bisect_noise_multiplier(search_eps, lo, hi, target)
    # The coarse grid is pessimistic, so hi meets the target at full precision too, except for
    # rare rounding; over many steps it can be several % conservative: then refine at full precision.
    eps_hi = final_eps(hi)
    if eps_hi <= target and (accountant != "pld" or eps_hi >= target * (1.0 - 2e-3)):
        return float(hi)
    if eps_hi <= target:
        lo = hi
        while lo > _SIGMA_MIN and final_eps(lo) <= target:
            hi, lo = lo, lo / 1.02
        hi = bisect_noise_multiplier(final_eps, lo, hi, target)
    sigma = hi
    for _ in range(200):  # guarantee at full precision
        if final_eps(sigma) <= target:
            return float(sigma)
        sigma *= 1.001
    raise PrivacyParameterError(f"calibration did not converge for epsilon={target}, delta={delta}")
